package quota_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/quota"
)

// Write an event in the application's own transaction, beside its own
// write, then let a Relay deliver it to a handler: the event exists if and
// only if the order row committed, and a delivered event is not sent again.
func ExampleClient_EnqueueTx() {
	ctx := context.Background()
	client, pool, done := exampleClient(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, paid bool)`); err != nil {
		log.Fatal(err)
	}
	err := quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (1001, true)`); err != nil {
			return err
		}
		_, err := client.EnqueueTx(ctx, tx, "order.paid", []byte(`{"order": 1001}`), nil)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	relay, err := client.NewRelay(func(ctx context.Context, ev quota.Event) error {
		fmt.Printf("deliver %s %s (attempt %d)\n", ev.Topic, ev.Payload, ev.Attempt)
		return nil // an error here retries the event later, with backoff
	}, quota.RelayConfig{Topics: []string{"order.paid"}})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 { // in production: relay.Run(ctx), which polls until ctx ends
		res, err := relay.RunOnce(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("batch: claimed=%d delivered=%d failed=%d\n", res.Claimed, res.Delivered, res.Failed)
	}
	// Output:
	// deliver order.paid {"order": 1001} (attempt 1)
	// batch: claimed=1 delivered=1 failed=0
	// batch: claimed=0 delivered=0 failed=0
}

// A rate quota: 2 units per hour with bursts of up to 2. The third grant in
// a row is denied, and RetryAfter says when it would fit (about half an
// hour: one unit's emission interval, Period/limit, measured by the
// database clock).
func ExampleClient_Grant_rate() {
	ctx := context.Background()
	client, _, done := exampleClient(ctx)
	defer done()
	rate := int64(2)
	_, err := client.DefineQuota(ctx, quota.Definition{Name: "reports", Window: quota.WindowRate,
		DefaultLimit: &rate, Period: time.Hour, Burst: 2})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		res, err := client.Grant(ctx, quota.GrantRequest{Quota: "reports", Member: "acme", Amount: 1})
		if err != nil {
			log.Fatal(err)
		}
		// The wait is rounded to minutes: a few milliseconds pass between grants.
		fmt.Printf("granted=%t remaining=%d retry_after=%s\n", res.Granted, res.Remaining, res.RetryAfter.Round(time.Minute))
	}
	// Output:
	// granted=true remaining=1 retry_after=0s
	// granted=true remaining=0 retry_after=0s
	// granted=false remaining=0 retry_after=30m0s
}
