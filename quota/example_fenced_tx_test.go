package quota_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/quota"
)

// Write an application's own guarded table under a lease in one call:
// FencedTx begins, presents the token, runs the function, commits, and
// maps the fence's errors. A holder deposed by a successor writes nothing.
func ExampleClient_FencedTx() {
	ctx := context.Background()
	client, pool, done := exampleClient(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE public.reports (id int PRIMARY KEY, status text, fence_token bigint)`); err != nil {
		log.Fatal(err)
	}
	g, err := client.GuardTable(ctx, quota.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
	if err != nil {
		log.Fatal(err)
	}
	// Holder defaults to host:pid (quota.DefaultHolder).
	l, err := client.Acquire(ctx, quota.AcquireRequest{Name: g.Resource, TTL: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	write := func(token int64, status string) error {
		return client.FencedTx(ctx, quota.FencedTxRequest{Resource: g.Resource, Token: token}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO public.reports (id, status) VALUES (1, $1)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status`, status)
			return err
		})
	}
	fmt.Println("holder writes:", write(l.Token, "running"))

	time.Sleep(200 * time.Millisecond) // the holder stalls past its TTL
	next, err := client.Acquire(ctx, quota.AcquireRequest{Name: g.Resource, TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	err = write(l.Token, "stale")
	fmt.Println("deposed holder refused:", errors.Is(err, quota.ErrStaleToken))
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

// Optional limits are *int64 (nil means "not given"): quota.Limit makes one.
func ExampleLimit() {
	ctx := context.Background()
	client, _, done := exampleClient(ctx)
	defer done()
	if _, err := client.DefineQuota(ctx, quota.Definition{Name: "uploads", Window: quota.WindowDay, DefaultLimit: quota.Limit(3)}); err != nil {
		log.Fatal(err)
	}
	res, err := client.Grant(ctx, quota.GrantRequest{Quota: "uploads", Member: "acme", Amount: 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("default limit:", res.Granted, res.Limit)
	res, err = client.Grant(ctx, quota.GrantRequest{Quota: "uploads", Member: "acme", Amount: 1, Limit: quota.Limit(2)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("call's limit:", res.Granted, res.Limit)
	// Output:
	// default limit: true 3
	// call's limit: false 2
}
