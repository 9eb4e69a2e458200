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
// New strategies plug in with Register. The fenced-lock strategies (lease
// acquire, fenced write) are listed as pending until their package lands;
// registering a strategy of the same name replaces the pending slot.
package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
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
	// Client is pgquota's client on Pool.
	Client *quota.Client
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

// Pending is a strategy that is announced but not built yet.
type Pending struct {
	Name   string
	Reason string
}

var registry = struct {
	sync.Mutex
	strategies []Strategy
	pending    []Pending
}{
	strategies: []Strategy{
		grantHot{}, grantSpread{}, grantFirst{},
		forUpdate{}, advisoryLock{}, serializable{},
		voucherClaim{},
		grantHotCoalesced{}, voucherSharded{},
	},
	// The fenced lock plugs in here: its package calls Register with a
	// Strategy named "lease-acquire" and one named "fenced-write", and the
	// slots below disappear.
	pending: []Pending{
		{Name: "lease-acquire", Reason: "arrives with the fenced lock (pgquota lease)"},
		{Name: "fenced-write", Reason: "arrives with the fenced lock (pgquota fence)"},
	},
}

// Register adds s to the strategies the bench knows, after the built-in
// ones. A pending slot of the same name is removed. It panics when a
// strategy of that name is already registered.
func Register(s Strategy) {
	registry.Lock()
	defer registry.Unlock()
	for _, have := range registry.strategies {
		if have.Name() == s.Name() {
			panic(fmt.Sprintf("bench: strategy %q registered twice", s.Name()))
		}
	}
	registry.strategies = append(registry.strategies, s)
	registry.pending = slices.DeleteFunc(registry.pending, func(p Pending) bool { return p.Name == s.Name() })
}

// Strategies returns the registered strategies in order.
func Strategies() []Strategy {
	registry.Lock()
	defer registry.Unlock()
	return slices.Clone(registry.strategies)
}

// PendingStrategies returns the strategies announced but not built yet.
func PendingStrategies() []Pending {
	registry.Lock()
	defer registry.Unlock()
	return slices.Clone(registry.pending)
}

// Lookup returns the registered strategy called name.
func Lookup(name string) (Strategy, bool) {
	for _, s := range Strategies() {
		if s.Name() == name {
			return s, true
		}
	}
	return nil, false
}
