package bench

import (
	"context"
	"fmt"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// The hot-row strategies: coalesced grants and a sharded voucher pool,
// each measured against the single-row statement it improves on.

// ShardedPoolShards is the number of shards of the voucher-sharded pool.
const ShardedPoolShards = 32

// grantHotCoalesced is grant-hot through a client with Config.Grouping GroupByCounter:
// concurrent calls on the hot counter share one statement. pgbench runs
// grant-hot's single conditional statement, one per transaction, so the
// ratio is coalesced grants per second over what the statement alone
// does on the same row.
type grantHotCoalesced struct{}

func (grantHotCoalesced) Name() string { return "grant-hot-coalesced" }
func (grantHotCoalesced) Describe() string {
	return "pgquota Grant with Config.Grouping GroupByCounter on the hot counter row (pgbench: grant-hot's statement)"
}
func (grantHotCoalesced) PgbenchBaseline() Strategy { return grantHot{} }
func (grantHotCoalesced) Setup(ctx context.Context, env Env) (Op, error) {
	if _, _, err := resetUsage(ctx, env, []string{hotMember}); err != nil {
		return Op{}, err
	}
	client, err := quota.New(env.Pool, &quota.Config{Grouping: quota.GroupByCounter, MeterProvider: env.MeterProvider})
	if err != nil {
		return Op{}, err
	}
	return grantOp(Env{Pool: env.Pool, Client: client}, func([]int64) string { return hotMember }), nil
}

// voucherSharded is voucher-claim on a pool split into ShardedPoolShards
// shards. pgbench runs voucher-claim's statement on a single-row pool, so
// the ratio is sharded claims per second over the single row's.
type voucherSharded struct{}

func (voucherSharded) Name() string { return "voucher-sharded" }
func (voucherSharded) Describe() string {
	return fmt.Sprintf("pgquota Claim, a new member every call, on a pool of %d shard rows (pgbench: voucher-claim's statement)", ShardedPoolShards)
}
func (voucherSharded) PgbenchBaseline() Strategy { return voucherClaim{} }
func (voucherSharded) Setup(ctx context.Context, env Env) (Op, error) {
	if _, err := env.Pool.Exec(ctx, `TRUNCATE pgquota.voucher_pool CASCADE`); err != nil {
		return Op{}, fmt.Errorf("reset voucher pools: %w", err)
	}
	if _, err := env.vouchers().CreateShardedCampaign(ctx, benchCampaign, quota.MaxUnits, ShardedPoolShards); err != nil {
		return Op{}, err
	}
	vouchers := env.vouchers()
	return Op{
		Vars: []Var{{Name: "member", Min: 1, Max: uniqueMax}},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			c, err := vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: benchCampaign, Member: memberFromVar(vals)})
			return Outcome{Granted: c.Claimed && !c.Repeat}, err
		},
	}, nil
}
