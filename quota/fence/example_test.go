package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// Write an application's own guarded table under a lease in one call:
// FencedTx begins, presents the token, runs the function, commits, and
// maps the fence's errors. A holder deposed by a successor writes nothing.
func ExampleClient_RunTx() {
	ctx := context.Background()
	client, pool, done := exampleClient(ctx)
	defer done()
	leases, err := lease.New(client)
	if err != nil {
		log.Fatal(err)
	}
	fences, err := fence.New(client)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE public.reports (id int PRIMARY KEY, status text, fence_token bigint)`); err != nil {
		log.Fatal(err)
	}
	g, err := fences.GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
	if err != nil {
		log.Fatal(err)
	}
	// Holder defaults to host:pid (lease.DefaultHolder).
	l, err := leases.Acquire(ctx, lease.AcquireRequest{Name: g.Resource, TTL: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	write := func(token int64, status string) error {
		return fences.RunTx(ctx, fence.TxRequest{Resource: g.Resource, Token: token}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO public.reports (id, status) VALUES (1, $1)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status`, status)
			return err
		})
	}
	fmt.Println("holder writes:", write(l.Token, "running"))

	time.Sleep(200 * time.Millisecond) // the holder stalls past its TTL
	next, err := leases.Acquire(ctx, lease.AcquireRequest{Name: g.Resource, TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	err = write(l.Token, "stale")
	fmt.Println("deposed holder refused:", errors.Is(err, fence.ErrStaleToken))
	fmt.Println("successor writes:", write(next.Token, "done"))

	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM public.reports WHERE id = 1`).Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("status:", status)
	// Output:
	// holder writes: <nil>
	// deposed holder refused: true
	// successor writes: <nil>
	// status: done
}

// Take a lease and write under its fencing token; a write carrying an
// older holder's token is refused.
func ExampleClient_WriteRow() {
	ctx := context.Background()
	client, _, done := exampleClient(ctx)
	defer done()
	leases, err := lease.New(client)
	if err != nil {
		log.Fatal(err)
	}
	fences, err := fence.New(client)
	if err != nil {
		log.Fatal(err)
	}
	first, err := leases.Acquire(ctx, lease.AcquireRequest{Name: "report", Holder: "worker-1", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := leases.Release(ctx, first); err != nil {
		log.Fatal(err)
	}
	second, err := leases.Acquire(ctx, lease.AcquireRequest{Name: "report", Holder: "worker-2", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	row, err := fences.WriteRow(ctx, fence.WriteRowRequest{Resource: "report", Key: "status", Value: "done", Token: second.Token})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("written %s=%s by the newer token: %t\n", row.Key, row.Value, row.Token == second.Token)
	_, err = fences.WriteRow(ctx, fence.WriteRowRequest{Resource: "report", Key: "status", Value: "stale", Token: first.Token})
	fmt.Println("older token refused:", errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost))
	// Output:
	// written status=done by the newer token: true
	// older token refused: true
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
	leases, err := lease.New(c)
	if err != nil {
		log.Fatal(err)
	}
	fences, err := fence.New(c)
	if err != nil {
		log.Fatal(err)
	}
	g, err := fences.GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
	if err != nil {
		log.Fatal(err)
	}
	l, err := leases.AcquireWait(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "worker-1", TTL: 30 * time.Second}, nil)
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	err = fences.PresentTokenTx(ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: l.Token})
	if errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost) {
		log.Printf("another worker took over: %v", err) // nothing was written
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	// Stamped with l.Token by the guard; a statement without a presented
	// token would fail with SQLSTATE PQ003 (fence.ErrTokenNotPresented).
	if _, err := tx.Exec(ctx, `UPDATE public.reports SET status = 'done' WHERE id = 1`); err != nil {
		log.Fatal(fence.MapError(err))
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
