package quota_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
)

// The fenced lock end to end: take the lease, keep it alive while working,
// and write through the fence, so that a holder paused past its TTL cannot
// overwrite its successor's work.
func ExampleClient_Keepalive() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	c, err := quota.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}

	l, err := c.AcquireWait(ctx, quota.AcquireRequest{Name: "nightly-report", Holder: "worker-1", TTL: 30 * time.Second}, nil)
	if err != nil {
		log.Fatal(err)
	}
	k, err := c.Keepalive(ctx, l, nil) // renews every 10s; ends k.Context() 3s before an unconfirmed expiry
	if err != nil {
		log.Fatal(err)
	}
	defer k.Stop()

	// ... long work under k.Context() ...

	_, err = c.WriteFencedRow(k.Context(), quota.WriteFencedRowRequest{
		Resource: "nightly-report", Key: "status", Value: "done", Token: l.Token, Lease: "nightly-report",
	})
	switch {
	case errors.Is(err, quota.ErrStaleToken), errors.Is(err, quota.ErrLeaseLost):
		log.Printf("another worker took over: %v", err) // nothing was written
	case err != nil:
		log.Fatal(err)
	}
	if _, err := c.Release(ctx, l.Name, l.Token); err != nil && !errors.Is(err, quota.ErrLeaseLost) {
		log.Print(err)
	}
}

// An application's own statements on a guarded table, under its lease's
// token: attach the guard once, then present the token in each writing
// transaction (SELECT pgquota.present_token(...) in plain SQL).
func ExampleClient_PresentTokenTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	c, err := quota.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	g, err := c.GuardTable(ctx, quota.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.AcquireWait(ctx, quota.AcquireRequest{Name: g.Resource, Holder: "worker-1", TTL: 30 * time.Second}, nil)
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	err = c.PresentTokenTx(ctx, tx, quota.PresentTokenRequest{Resource: g.Resource, Token: l.Token})
	if errors.Is(err, quota.ErrStaleToken) || errors.Is(err, quota.ErrLeaseLost) {
		log.Printf("another worker took over: %v", err) // nothing was written
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	// Stamped with l.Token by the guard; a statement without a presented
	// token would fail with SQLSTATE PQ003 (quota.ErrTokenNotPresented).
	if _, err := tx.Exec(ctx, `UPDATE public.reports SET status = 'done' WHERE id = 1`); err != nil {
		log.Fatal(quota.MapFenceError(err))
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
