package quota_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/pgquota/pgquota/quota"
)

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
