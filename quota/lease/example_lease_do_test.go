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

// Run a job while holding its lease: acquire (waiting), keep alive, run,
// release. Writes inside carry the lease's token.
func ExampleClient_Do() {
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
	err = leases.Do(ctx, lease.DoRequest{Name: "nightly-report", TTL: 30 * time.Second, Wait: true},
		func(ctx context.Context) error { // ends before the lease can expire
			l, _ := lease.FromContext(ctx)
			_, err := fences.WriteRow(ctx, fence.WriteRowRequest{
				Resource: "nightly-report", Key: "status", Value: "done", Token: l.Token, Lease: l.Name,
			})
			return err
		})
	if errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost) {
		log.Printf("lost the lease; nothing was written: %v", err)
	} else if err != nil {
		log.Fatal(err)
	}
}

// Leader election: campaign, lead under the term's context, resign.
func ExampleElection() {
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
	e, err := leases.NewElection("scheduler", lease.ElectionOptions{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	lead, err := e.Campaign(ctx, "10.0.0.7:8080") // blocks until leader
	if err != nil {
		log.Fatal(err)
	}
	defer lead.Resign(ctx)
	// ... act as leader under lead.Context(), fencing writes with lead.Token() ...
	<-lead.Context().Done() // lost (a pause past the TTL) or resigned
	log.Print(context.Cause(lead.Context()))
}
