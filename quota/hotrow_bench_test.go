package quota_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// BenchmarkGrantCoalesced measures Grant on one hot counter row with N
// concurrent callers, each a goroutine, on a pool of N connections, with
// and without Config.Coalesce, back to back: coalesced calls share one
// statement (and one commit) per batch; "keyed" gives every call its own
// idempotency key (one ledger entry each, four statements per batch). It
// reports grants/s.
//
//	go test ./quota -run '^$' -bench GrantCoalesced -benchtime 5s
//
// `pgquota bench --strategy grant-hot,grant-hot-coalesced --pgbench` sets
// the same beside pgbench running the single statement.
func BenchmarkGrantCoalesced(b *testing.B) {
	url := pgtest.NewURL(b)
	setup, err := quota.New(pgtest.ConnectOperator(b, url, 2), nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := setup.DefineQuota(context.Background(), quota.Definition{Name: "bench", Window: quota.WindowNone}); err != nil {
		b.Fatal(err)
	}
	var run atomic.Int64
	for _, clients := range []int{8, 64} {
		for _, mode := range []string{"false", "true", "keyed"} {
			b.Run(fmt.Sprintf("clients=%d/coalesce=%s", clients, mode), func(b *testing.B) {
				pool := pgtest.Connect(b, url, int32(clients))
				client, err := quota.New(pool, &quota.Config{Coalesce: mode != "false"})
				if err != nil {
					b.Fatal(err)
				}
				limit := quota.MaxUnits
				prefix := fmt.Sprint("run-", run.Add(1), "-")
				runClients(b, clients, func(ctx context.Context, i int64) error {
					var key quota.IdempotencyKey
					if mode == "keyed" {
						key.Key = prefix + strconv.FormatInt(i, 10)
					}
					res, err := client.Grant(ctx, quota.GrantRequest{Quota: "bench", Member: "hot", Amount: 1, Limit: &limit, Idempotency: key})
					if err == nil && !res.Granted {
						err = fmt.Errorf("denied: %+v", res)
					}
					return err
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
			})
		}
	}
}

// BenchmarkClaimSharded measures Claim, a new member every call,
// with N concurrent callers on a pool of N connections: on a counted pool
// (one row) and on pools of 8 and 32 shards, back to back. It reports
// claims/s.
//
//	go test ./quota -run '^$' -bench ClaimSharded -benchtime 5s
func BenchmarkClaimSharded(b *testing.B) {
	url := pgtest.NewURL(b)
	setup, err := quota.New(pgtest.ConnectOperator(b, url, 2), nil)
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	for _, clients := range []int{64} {
		for _, shards := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("clients=%d/shards=%d", clients, shards), func(b *testing.B) {
				campaign := fmt.Sprintf("bench-%d", seq.Add(1))
				ctx := context.Background()
				if shards == 1 {
					_, err = voucherOf(b, setup).CreateCampaign(ctx, campaign, quota.MaxUnits)
				} else {
					_, err = voucherOf(b, setup).CreateShardedCampaign(ctx, campaign, quota.MaxUnits, shards)
				}
				if err != nil {
					b.Fatal(err)
				}
				pool := pgtest.Connect(b, url, int32(clients))
				client, err := quota.New(pool, nil)
				if err != nil {
					b.Fatal(err)
				}
				runClients(b, clients, func(ctx context.Context, i int64) error {
					c, err := voucherOf(b, client).Claim(ctx, voucher.ClaimRequest{Campaign: campaign, Member: strconv.FormatInt(i, 10)})
					if err == nil && (!c.Claimed || c.Repeat) {
						err = fmt.Errorf("not a new claim: %+v", c)
					}
					return err
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
			})
		}
	}
}
