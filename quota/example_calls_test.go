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

// Grant a unit in the application's own transaction, beside its own write:
// the export row and the unit commit together, or neither does.
func ExampleClient_GrantTx() {
	ctx := context.Background()
	client, pool, done := exampleClient(ctx)
	defer done()
	limit := int64(1)
	if _, err := client.DefineQuota(ctx, quota.Definition{Name: "exports", Window: quota.WindowNone, DefaultLimit: &limit}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE exports (member text, file text)`); err != nil {
		log.Fatal(err)
	}
	for _, file := range []string{"q1.csv", "q2.csv"} {
		err := quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			res, err := client.GrantTx(ctx, tx, quota.GrantRequest{Quota: "exports", Member: "acme", Amount: 1})
			if err != nil || !res.Granted {
				fmt.Printf("%s: granted=%t\n", file, res.Granted)
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO exports VALUES ('acme', $1)`, file)
			fmt.Printf("%s: granted=%t\n", file, res.Granted)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM exports`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("export rows:", n)
	// Output:
	// q1.csv: granted=true
	// q2.csv: granted=false
	// export rows: 1
}

// Give back the units of one keyed grant when a later step of the work
// fails (a saga's compensation); a repeated compensation changes nothing.
func ExampleClient_CompensateGrant() {
	ctx := context.Background()
	client, _, done := exampleClient(ctx)
	defer done()
	limit := int64(10)
	if _, err := client.DefineQuota(ctx, quota.Definition{Name: "sms", Window: quota.WindowNone, DefaultLimit: &limit}); err != nil {
		log.Fatal(err)
	}
	g, err := client.Grant(ctx, quota.GrantRequest{Quota: "sms", Member: "acme", Amount: 3,
		Idempotency: quota.IdempotencyKey{Key: "order-17/sms"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("granted=%t used=%d\n", g.Granted, g.Used)
	for range 2 {
		c, err := client.CompensateGrant(ctx, g.GrantID)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("revoked=%d used=%d replayed=%t\n", c.Revoked, c.Used, c.Replayed)
	}
	// Output:
	// granted=true used=3
	// revoked=3 used=0 replayed=false
	// revoked=3 used=0 replayed=true
}

// Take a lease and write under its fencing token; a write carrying an
// older holder's token is refused.
func ExampleClient_WriteFencedRow() {
	ctx := context.Background()
	client, _, done := exampleClient(ctx)
	defer done()
	first, err := client.Acquire(ctx, quota.AcquireRequest{Name: "report", Holder: "worker-1", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.Release(ctx, first.Name, first.Token); err != nil {
		log.Fatal(err)
	}
	second, err := client.Acquire(ctx, quota.AcquireRequest{Name: "report", Holder: "worker-2", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	row, err := client.WriteFencedRow(ctx, quota.WriteFencedRowRequest{Resource: "report", Key: "status", Value: "done", Token: second.Token})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("written %s=%s by the newer token: %t\n", row.Key, row.Value, row.Token == second.Token)
	_, err = client.WriteFencedRow(ctx, quota.WriteFencedRowRequest{Resource: "report", Key: "status", Value: "stale", Token: first.Token})
	fmt.Println("older token refused:", errors.Is(err, quota.ErrStaleToken) || errors.Is(err, quota.ErrLeaseLost))
	// Output:
	// written status=done by the newer token: true
	// older token refused: true
}
