package lease_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
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
	leases, err := lease.New(c)
	if err != nil {
		log.Fatal(err)
	}
	fences, err := fence.New(c)
	if err != nil {
		log.Fatal(err)
	}

	l, err := leases.AcquireWait(ctx, lease.AcquireRequest{Name: "nightly-report", Holder: "worker-1", TTL: 30 * time.Second}, nil)
	if err != nil {
		log.Fatal(err)
	}
	k, err := leases.Keepalive(ctx, l, nil) // renews every 10s; ends k.Context() 3s before an unconfirmed expiry
	if err != nil {
		log.Fatal(err)
	}
	defer k.Stop()

	// ... long work under k.Context() ...

	_, err = fences.WriteRow(k.Context(), fence.WriteRowRequest{
		Resource: "nightly-report", Key: "status", Value: "done", Token: l.Token, Lease: "nightly-report",
	})
	switch {
	case errors.Is(err, fence.ErrStaleToken), errors.Is(err, lease.ErrLost):
		log.Printf("another worker took over: %v", err) // nothing was written
	case err != nil:
		log.Fatal(err)
	}
	if _, err := leases.Release(ctx, l); err != nil && !errors.Is(err, lease.ErrLost) {
		log.Print(err)
	}
}
