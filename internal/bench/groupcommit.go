package bench

import (
	"context"
	"strconv"

	"github.com/pgquota/pgquota/quota"
)

// The group-commit strategies: grant-spread and grant-hot through a client
// with the default Config (group commit: Config.Grouping), where concurrent
// calls for any counters share one statement and one commit. pgbench runs the plain strategy's single
// conditional statement, one per transaction, so the ratio is grouped
// grants per second over what the statement alone does.

// grantSpreadGrouped is grant-spread with the default Config (group commit).
type grantSpreadGrouped struct{}

func (grantSpreadGrouped) Name() string { return "grant-spread-grouped" }
func (grantSpreadGrouped) Describe() string {
	return "pgquota Grant with the default Config (group commit), spread over 10000 existing counter rows (pgbench: grant-spread's statement)"
}
func (grantSpreadGrouped) PgbenchBaseline() Strategy { return grantSpread{} }
func (grantSpreadGrouped) Setup(ctx context.Context, env Env) (Op, error) {
	members := make([]string, SpreadMembers)
	for i := range members {
		members[i] = strconv.Itoa(i + 1)
	}
	if _, _, err := resetUsage(ctx, env, members); err != nil {
		return Op{}, err
	}
	client, err := quota.New(env.Pool, &quota.Config{MeterProvider: env.MeterProvider})
	if err != nil {
		return Op{}, err
	}
	return grantOp(Env{Pool: env.Pool, Client: client}, memberFromVar, Var{Name: "member", Min: 1, Max: SpreadMembers}), nil
}

// grantHotGrouped is grant-hot with the default Config (group commit).
type grantHotGrouped struct{}

func (grantHotGrouped) Name() string { return "grant-hot-grouped" }
func (grantHotGrouped) Describe() string {
	return "pgquota Grant with the default Config (group commit) on the hot counter row (pgbench: grant-hot's statement)"
}
func (grantHotGrouped) PgbenchBaseline() Strategy { return grantHot{} }
func (grantHotGrouped) Setup(ctx context.Context, env Env) (Op, error) {
	if _, _, err := resetUsage(ctx, env, []string{hotMember}); err != nil {
		return Op{}, err
	}
	client, err := quota.New(env.Pool, &quota.Config{MeterProvider: env.MeterProvider})
	if err != nil {
		return Op{}, err
	}
	return grantOp(Env{Pool: env.Pool, Client: client}, func([]int64) string { return hotMember }), nil
}
