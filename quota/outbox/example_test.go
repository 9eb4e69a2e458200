package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// Write an event in the application's own transaction, beside its own
// write, then let a Relay deliver it to a handler: the event exists if and
// only if the order row committed, and a delivered event is not sent again.
func ExampleClient_EnqueueTx() {
	ctx := context.Background()
	client, pool, done := testbundle.ExampleClient(ctx)
	events, err := outbox.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, paid bool)`); err != nil {
		log.Fatal(err)
	}
	err = quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (1001, true)`); err != nil {
			return err
		}
		_, err := events.EnqueueTx(ctx, tx, "order.paid", []byte(`{"order": 1001}`), nil)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	relay, err := events.NewRelay(func(ctx context.Context, ev outbox.Event) error {
		fmt.Printf("deliver %s %s (attempt %d)\n", ev.Topic, ev.Payload, ev.Attempt)
		return nil // an error here retries the event later, with backoff
	}, outbox.RelayConfig{Topics: []string{"order.paid"}})
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
