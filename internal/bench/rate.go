package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/pgquota/pgquota/quota"
)

// The limit shapes (quota kinds rate, fixed and rolling) beside
// go-redis/redis_rate, the GCRA limiter users pick instead: the same rate
// and burst, members drawn from the same range, on the local Redis (as it
// runs here: no persistence) and on a Redis this process starts with
// --appendonly yes --appendfsync always (durable, like our commits).
// RedisRatios prints pgquota's throughput over redis_rate's per client
// count.

const (
	rateQuota    = "bench-rate"
	fixedQuota   = "bench-fixed"
	rollingQuota = "bench-rolling"
	// rateMembers is how many members the rate strategies spread over.
	rateMembers = 1000
	// ratePerSecond is the rate (and burst) of every rate strategy: high
	// enough that grants succeed, so both sides write on every call.
	ratePerSecond = 1_000_000
)

var rateVar = Var{Name: "member", Min: 1, Max: rateMembers}

// shapeGrant defines q and returns an Op granting 1 unit of it to a member
// drawn from rateVar.
// The call names the quota's limit, so the statement has no NULL argument
// (pgbench cannot pass one).
func shapeGrant(ctx context.Context, env Env, d quota.Definition, reset string) (Op, error) {
	return shapeGrantWith(ctx, env, d, reset, nil, func(vals []int64) string { return strconv.FormatInt(vals[0], 10) })
}

// shapeGrantWith is shapeGrant through a client of its own with cfg (nil:
// env's client), granting to member(vals).
func shapeGrantWith(ctx context.Context, env Env, d quota.Definition, reset string, cfg *quota.Config, member func([]int64) string) (Op, error) {
	if _, err := env.Client.DefineQuota(ctx, d); err != nil {
		return Op{}, err
	}
	if _, err := env.Pool.Exec(ctx, reset, d.Name); err != nil {
		return Op{}, fmt.Errorf("reset %s: %w", d.Name, err)
	}
	client := env.Client
	if cfg != nil {
		var err error
		if client, err = quota.New(env.Pool, cfg); err != nil {
			return Op{}, err
		}
	}
	return Op{
		Vars: []Var{rateVar},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			res, err := client.Grant(ctx, quota.GrantRequest{Quota: d.Name, Member: member(vals), Amount: 1, Limit: d.DefaultLimit})
			return Outcome{Granted: res.Granted}, err
		},
	}, nil
}

// rateGCRA is a grant of a rate quota (GCRA), 1,000,000/s with that burst,
// over 1,000 members.
type rateGCRA struct{}

func (rateGCRA) Name() string { return "rate-gcra" }
func (rateGCRA) Describe() string {
	return "grant 1 of a rate quota (GCRA, 1000000/s, burst 1000000), 1000 members (pgquota.grant_limits)"
}
func (rateGCRA) Setup(ctx context.Context, env Env) (Op, error) {
	return shapeGrant(ctx, env, quota.Definition{Name: rateQuota, Window: quota.WindowRate, DefaultLimit: ptrInt(ratePerSecond), Period: time.Second},
		`DELETE FROM pgquota.rate_state WHERE quota_name = $1`)
}

// rateSpread is a grant of rate-gcra's quota through a client with the
// default Config (group commit), over SpreadMembers members: the rate
// counterpart of grant-spread-grouped, a case of the peers bench.
type rateSpread struct{}

func (rateSpread) Name() string { return "rate-spread" }
func (rateSpread) Describe() string {
	return fmt.Sprintf("grant 1 of a rate quota (GCRA, %d/s), %d members, default Config (group commit)", ratePerSecond, SpreadMembers)
}
func (rateSpread) Setup(ctx context.Context, env Env) (Op, error) {
	op, err := shapeGrantWith(ctx, env, quota.Definition{Name: rateQuota, Window: quota.WindowRate, DefaultLimit: ptrInt(ratePerSecond), Period: time.Second},
		`DELETE FROM pgquota.rate_state WHERE quota_name = $1`, &quota.Config{MeterProvider: env.MeterProvider},
		func(vals []int64) string { return strconv.FormatInt(vals[0], 10) })
	op.Vars = []Var{{Name: "member", Min: 1, Max: SpreadMembers}}
	return op, err
}

// rateHot is rate-gcra on one hot member, plain (a statement per call),
// with Config.Grouping GroupByCounter or with the default Config: the limit-shape
// counterparts of grant-hot, grant-hot-coalesced and grant-hot-grouped.
// pgbench runs rate-gcra's statement (its script spreads over the members).
type rateHot struct{ mode string } // "", "coalesced" or "grouped"

func (r rateHot) Name() string {
	if r.mode == "" {
		return "rate-gcra-hot"
	}
	return "rate-gcra-hot-" + r.mode
}
func (r rateHot) Describe() string {
	how := map[string]string{"": "one statement per call", "coalesced": "with Config.Grouping GroupByCounter", "grouped": "with the default Config (group commit)"}[r.mode]
	return "grant 1 of rate-gcra's quota to one hot member, " + how + " (pgbench: rate-gcra's statement)"
}
func (rateHot) PgbenchBaseline() Strategy { return rateGCRA{} }
func (r rateHot) Setup(ctx context.Context, env Env) (Op, error) {
	var cfg *quota.Config
	switch r.mode {
	case "coalesced":
		cfg = &quota.Config{Grouping: quota.GroupByCounter, MeterProvider: env.MeterProvider}
	case "grouped":
		cfg = &quota.Config{MeterProvider: env.MeterProvider}
	}
	return shapeGrantWith(ctx, env, quota.Definition{Name: rateQuota, Window: quota.WindowRate, DefaultLimit: ptrInt(ratePerSecond), Period: time.Second},
		`DELETE FROM pgquota.rate_state WHERE quota_name = $1`, cfg, func([]int64) string { return hotMember })
}

// windowFixed is a grant of a 10 s fixed window quota.
type windowFixed struct{}

func (windowFixed) Name() string { return "window-fixed" }
func (windowFixed) Describe() string {
	return "grant 1 of a 10s fixed-window quota (limit 1000000000), 1000 members (pgquota.grant_limits)"
}
func (windowFixed) Setup(ctx context.Context, env Env) (Op, error) {
	return shapeGrant(ctx, env, quota.Definition{Name: fixedQuota, Window: quota.WindowFixed, DefaultLimit: ptrInt(1_000_000_000), Period: 10 * time.Second},
		`DELETE FROM pgquota.usage WHERE quota_name = $1`)
}

// windowRolling is a grant of a rolling window quota: at most 10,000 per
// second, exactly.
type windowRolling struct{}

func (windowRolling) Name() string { return "window-rolling" }
func (windowRolling) Describe() string {
	return "grant 1 of a rolling-window quota (10000 in any 1s), 1000 members (pgquota.grant_limits)"
}
func (windowRolling) Setup(ctx context.Context, env Env) (Op, error) {
	return shapeGrant(ctx, env, quota.Definition{Name: rollingQuota, Window: quota.WindowRolling, DefaultLimit: ptrInt(quota.MaxRollingLimit), Period: time.Second},
		`DELETE FROM pgquota.rolling_usage WHERE quota_name = $1`)
}

func ptrInt(v int64) *int64 { return &v }

// redisRateStrategy is go-redis/redis_rate/v10's AllowN with the rate of rateGCRA.
// Durable selects the Redis this process starts with appendfsync always;
// otherwise it runs on $PGQUOTA_BENCH_REDIS_ADDR, default 127.0.0.1:6379.
// Hot puts every call on one key (rate-gcra-hot's counterpart).
type redisRateStrategy struct{ durable, hot bool }

func (r redisRateStrategy) Name() string {
	name := "redis-rate"
	if r.hot {
		name += "-hot"
	}
	if r.durable {
		name += "-durable"
	}
	return name
}
func (r redisRateStrategy) Describe() string {
	keys := ""
	if r.hot {
		keys = ", one hot key"
	}
	if r.durable {
		return "go-redis/redis_rate AllowN, same rate" + keys + ", on a Redis the bench starts with --appendonly yes --appendfsync always"
	}
	return "go-redis/redis_rate AllowN, same rate" + keys + ", on the local Redis (no persistence; PGQUOTA_BENCH_REDIS_ADDR)"
}

// PgbenchBaseline: Redis sends no SQL; with --pgbench the ratio compares it
// with pgbench running rate-gcra's statement.
func (redisRateStrategy) PgbenchBaseline() Strategy { return rateGCRA{} }

var durableRedis struct {
	once sync.Once
	r    *RedisServer
	err  error
}

func (r redisRateStrategy) Setup(ctx context.Context, env Env) (Op, error) {
	addr := os.Getenv("PGQUOTA_BENCH_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	if r.durable {
		// Started once per process, killed with it (svcproc: Pdeathsig).
		durableRedis.once.Do(func() {
			durableRedis.r, durableRedis.err = StartRedis(context.WithoutCancel(ctx), true)
		})
		if durableRedis.err != nil {
			return Op{}, fmt.Errorf("start a durable redis-server: %w", durableRedis.err)
		}
		addr = durableRedis.r.Addr
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: int(env.Pool.Config().MaxConns)})
	if err := rdb.Ping(ctx).Err(); err != nil {
		return Op{}, fmt.Errorf("redis at %s: %w (start it, or set PGQUOTA_BENCH_REDIS_ADDR)", addr, err)
	}
	limit := redis_rate.Limit{Rate: ratePerSecond, Burst: ratePerSecond, Period: time.Second}
	prefix := fmt.Sprintf("pgquota-bench-%d-%d:", os.Getpid(), time.Now().UnixNano())
	key := func(vals []int64) string { return prefix + strconv.FormatInt(vals[0], 10) }
	if r.hot {
		key = func([]int64) string { return prefix + hotMember }
	}
	return redisRateOp(rdb, limit, rateVar, key), nil
}

// redisRateOp is one go-redis/redis_rate AllowN of one unit per call under
// limit, on the key that key names for the call's values of v.
func redisRateOp(rdb *redis.Client, limit redis_rate.Limit, v Var, key func([]int64) string) Op {
	limiter := redis_rate.NewLimiter(rdb)
	return Op{
		Vars: []Var{v},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			res, err := limiter.AllowN(ctx, key(vals), limit, 1)
			if err != nil {
				return Outcome{}, err
			}
			return Outcome{Granted: res.Allowed > 0}, nil
		},
	}
}

// RedisRatios returns, for every client count at which a pgquota rate or
// window strategy and a redis_rate strategy both ran (the hot rate
// strategies against the hot redis_rate ones), the line
// "ratio <pgquota strategy>/<redis strategy>/<clients> <ops/s over ops/s>".
func RedisRatios(rep *Report) []string {
	byKey := map[string]float64{}
	for _, r := range rep.Results {
		byKey[r.Strategy+"/"+strconv.Itoa(r.Clients)] = r.Library.OpsPerSec
	}
	var out []string
	for _, r := range rep.Results {
		peers := []string{"redis-rate", "redis-rate-durable"}
		switch r.Strategy {
		case "rate-gcra", "window-fixed", "window-rolling":
		case "rate-gcra-hot", "rate-gcra-hot-coalesced", "rate-gcra-hot-grouped":
			peers = []string{"redis-rate-hot", "redis-rate-hot-durable"}
		default:
			continue
		}
		for _, redisName := range peers {
			v, ok := byKey[redisName+"/"+strconv.Itoa(r.Clients)]
			if !ok || v == 0 {
				continue
			}
			out = append(out, fmt.Sprintf("ratio %s/%s/%d %.2f", r.Strategy, redisName, r.Clients, r.Library.OpsPerSec/v))
		}
	}
	return out
}
