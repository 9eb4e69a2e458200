// Package bench measures what each way of doing "check, then act" on
// PostgreSQL costs: throughput and latency per strategy and client count,
// through pgquota's library and, with the very same SQL, through pgbench.
//
// A Strategy prepares the scratch database and returns an Op: one
// operation (a grant, a claim, a locked read-modify-write) that the runner
// calls from N goroutines on a pool of exactly N connections. For pgbench,
// the statements an Op sends are captured with a pgx tracer and turned into
// a pgbench script (see BuildScript), so both sides run the same SQL by
// construction.
//
// The strategies are listed in Strategies: the conditional grants, the
// hand-written locking transactions, the voucher claim, and the fenced
// lock's two hot statements (lease.go).
package bench

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/voucher"
	"go.opentelemetry.io/otel/metric"
)

// Strategy is one way of doing an operation that the bench measures.
type Strategy interface {
	// Name is the strategy's short name, used by --strategy and in output.
	Name() string
	// Describe says in a few words what one operation does.
	Describe() string
	// Setup brings the scratch database to the strategy's starting state,
	// undoing what an earlier run changed, and returns the operation to
	// measure, bound to env. It is called before every measured run and
	// before every capture, each time with a fresh env.
	Setup(ctx context.Context, env Env) (Op, error)
}

// Env is what a strategy's operation runs against.
type Env struct {
	// Pool is the pool whose statements are measured or captured. An Op
	// sends every statement through it.
	Pool *pgxpool.Pool
	// Client is pgquota's client on Pool; Leases and Fences its lease and
	// fence clients.
	Client *quota.Client
	Leases *lease.Client
	Fences *fence.Client
	// MeterProvider is Client's Config.MeterProvider (nil: none), for the
	// strategies that create a client of their own.
	MeterProvider metric.MeterProvider
}

// Var is an input that changes from one operation to the next. The runner
// draws it uniformly from [Min, Max] for every operation, and the pgbench
// script draws it the same way (`\set Name random(Min, Max)`). An Op
// passes it to the database as an integer or as its decimal text, so that
// pgbench's variable, which is sent as text, is the same value.
type Var struct {
	Name     string
	Min, Max int64
}

// Op is one operation of a strategy, ready to run.
type Op struct {
	// Vars are the operation's varying inputs, in the order Do receives
	// their values.
	Vars []Var
	// Do performs one operation. It sends every statement through the
	// Env's pool, and the same statements in the same order whatever the
	// values (the pgbench script repeats one captured operation).
	Do func(ctx context.Context, vals []int64) (Outcome, error)
	// MaxTries is pgbench's --max-tries for the script: 1 (the default,
	// also for 0) for no retries, -1 for retries without limit, matching
	// how Do itself retries serialization failures and deadlocks.
	MaxTries int
}

// Outcome is the result of one operation.
type Outcome struct {
	// Granted reports whether the operation got what it asked for.
	Granted bool
	// Retries counts the transactions Do retried after a serialization
	// failure or deadlock.
	Retries int
}

// strategies are the bench's strategies, in the order it runs them.
var strategies = []Strategy{
	grantHot{}, grantSpread{}, grantFirst{},
	forUpdate{}, advisoryLock{}, serializable{},
	voucherClaim{},
	leaseAcquire{}, fencedWrite{},
	grantHotCoalesced{}, voucherSharded{},
	rateGCRA{}, windowFixed{}, windowRolling{}, redisRateStrategy{}, redisRateStrategy{durable: true},
	grantSpreadGrouped{}, grantHotGrouped{},
	rateHot{}, rateHot{mode: "coalesced"}, rateHot{mode: "grouped"},
	redisRateStrategy{hot: true}, redisRateStrategy{hot: true, durable: true},
}

// Baseline is implemented by a strategy whose pgbench side runs another
// strategy's SQL instead of its own: a strategy that changes how many
// statements an operation takes (coalesced grants decide many calls in one
// statement) is measured against the statement it replaces. Run then
// captures, sets up and runs the baseline's script for pgbench, and the
// ratio compares the strategy's operations per second with the baseline's
// transactions per second.
type Baseline interface {
	Strategy
	// PgbenchBaseline returns the strategy whose SQL pgbench runs.
	PgbenchBaseline() Strategy
}

// pgbenchSide returns the strategy whose SQL pgbench runs for s.
func pgbenchSide(s Strategy) Strategy {
	if b, ok := s.(Baseline); ok {
		return b.PgbenchBaseline()
	}
	return s
}

// Strategies returns the bench's strategies in order.
func Strategies() []Strategy { return slices.Clone(strategies) }

// Lookup returns the registered strategy called name.
func Lookup(name string) (Strategy, bool) {
	for _, s := range Strategies() {
		if s.Name() == name {
			return s, true
		}
	}
	return nil, false
}

// vouchers returns the voucher client on Client (a quota client's settings
// always make one).
func (e Env) vouchers() *voucher.Client {
	v, err := voucher.New(e.Client, nil)
	if err != nil {
		panic("bench: voucher client: " + err.Error())
	}
	return v
}
