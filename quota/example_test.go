package quota_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
)

// Grant a member two free exports, ever: the third is denied. The check and
// the write are one statement, so the limit holds however many servers ask
// at once.
func Example() {
	ctx := context.Background()
	dbURL, drop := exampleDatabase(ctx) // your application's database
	defer drop()

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := quota.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Migrate(ctx); err != nil { // or: pgquota migrate up
		log.Fatal(err)
	}

	limit := int64(2)
	_, err = client.DefineQuota(ctx, quota.Definition{Name: "free-exports", Window: quota.WindowNone, DefaultLimit: &limit})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		res, err := client.Grant(ctx, quota.GrantRequest{Quota: "free-exports", Member: "acme", Amount: 1})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("granted=%t used=%d remaining=%d\n", res.Granted, res.Used, res.Remaining)
	}
	// Output:
	// granted=true used=1 remaining=1
	// granted=true used=2 remaining=0
	// granted=false used=2 remaining=0
}
