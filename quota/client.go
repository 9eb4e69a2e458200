package quota

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/migrations"
)

// Config holds a Client's settings. The zero value (or a nil *Config) is
// ready to use.
type Config struct {
	// RetryMaxElapsed bounds how long a call that owns its transaction
	// (every call without a Tx suffix) keeps retrying a serialization
	// failure (SQLSTATE 40001) or deadlock (40P01) before it returns the
	// error. Retries wait with exponential backoff and jitter, from 2ms up to
	// 100ms apart. These errors occur when the database runs transactions
	// at REPEATABLE READ or SERIALIZABLE (default_transaction_isolation);
	// see IsRetryable. The caller's context bounds it too. Defaults to
	// DefaultRetryMaxElapsed (30s).
	RetryMaxElapsed time.Duration

	// Grouping says which concurrent Grant calls of this client share a
	// statement and a commit. The default, GroupAcrossCounters, is group
	// commit: while a statement is in flight, the calls that arrive for any
	// counters (members or quotas) wait, and the next statement decides
	// all of them, set-based, locking the counters in key order. Each call
	// still gets exactly the outcome it would have got alone (calls of one
	// counter decided in arrival order, Used included), its own error
	// (ErrQuotaNotFound, ErrNoLimit) never fails the others, and keyed
	// calls are grouped too (apart from unkeyed ones). No call waits on a
	// timer: one that finds the client idle runs at once on Grant's own
	// statement, exactly as without grouping. A group waits at most 100 ms
	// for a row another transaction holds (an application transaction
	// that called GrantTx and has not committed): past it the group splits
	// by counter, so that the held counter's calls wait for it alone and the
	// others go on (groupcommit.go). A call's context still bounds its
	// wait: see ErrGrantAbandoned. GroupByCounter groups only calls of one
	// counter and limit (coalesce.go); GroupNone gives every call its own
	// statement and commit. GrantTx and GrantBatch are never grouped;
	// a grant against several quotas (GrantRequest.Quotas) runs alone.
	// Quotas of every kind are grouped (a rate, fixed or rolling quota's
	// calls share one pgquota.grant_limits_batch statement, each decided
	// at its own instant as if alone); a group holding both calendar and
	// rate, fixed or rolling calls takes two statements in one transaction
	// (one commit).
	Grouping Grouping

	// Coalesce, when Grouping is left at its default, selects
	// GroupByCounter.
	//
	// Deprecated: set Grouping to GroupByCounter. Grant calls of a
	// client are grouped across counters by default since v0.3.0.
	Coalesce bool

	// GroupCommit selects GroupAcrossCounters, which is the default.
	//
	// Deprecated: group commit is the default since v0.3.0; leave it
	// unset.
	GroupCommit bool

	// OnAbandonedGrant, when not nil, is called with the outcome of each
	// coalesced grant whose caller gave up (its context ended) after the
	// call had been sent to the database: res when err is nil, else the
	// error the call would have returned. The database decided such a call
	// like any other, so an application that counts the units it handed out
	// adds the granted ones here. It is called from the goroutine that sent
	// the statement, after the batch's outcomes were delivered; it must not
	// block for long. Defaults to nil (such outcomes are only in the
	// counter).
	OnAbandonedGrant func(req GrantRequest, res GrantResult, err error)

	// Pooler says what sits between the pool and PostgreSQL. Set it to
	// PoolerTransaction behind a pooler in transaction mode (PgBouncer's
	// pool_mode = transaction and the like): every call then keeps no
	// session state on the server connections it borrows. lease.Client.AcquireWait
	// polls instead of LISTENing
	// (see WaitOptions for the intervals), and New refuses a pool whose pgx
	// query exec mode is unsafe behind such a pooler (see
	// PoolerMode.CheckExecMode: use pgx.QueryExecModeExec). Migrate, whose
	// lock needs a session, refuses to run (ErrInvalidInput). The pgquota
	// command sets it with --pooler or $PGQUOTA_POOLER. Defaults to
	// PoolerNone (a direct connection or a session-mode pooler).
	Pooler PoolerMode

	// MeterProvider, when not nil, receives pgquota's OpenTelemetry metrics:
	// grants by outcome, fenced writes, lease calls and renewal margins,
	// outbox deliveries and gauges, retries, outcome-unknown errors, call
	// durations (metrics.go; docs/metrics.md lists every
	// instrument). Defaults to nil: nothing is recorded, at no cost.
	MeterProvider metric.MeterProvider

	// MetricsQuotaName adds the quota name (attribute pgquota.quota) to the
	// grant instruments. Each quota name then makes series of its own: set
	// it only when quota names are few. Defaults to false.
	MetricsQuotaName bool
}

// Grouping is Config.Grouping: which concurrent Grant calls of a Client
// share a statement and a commit.
type Grouping int

const (
	// GroupAcrossCounters groups concurrent calls of any counters: group
	// commit (DeWitt et al., SIGMOD 1984), the default.
	GroupAcrossCounters Grouping = iota
	// GroupByCounter groups concurrent calls of one counter and limit only
	// (coalescing).
	GroupByCounter
	// GroupNone runs every call on its own statement and commit.
	GroupNone
)

// String returns the constant's name.
func (g Grouping) String() string {
	switch g {
	case GroupAcrossCounters:
		return "GroupAcrossCounters"
	case GroupByCounter:
		return "GroupByCounter"
	case GroupNone:
		return "GroupNone"
	}
	return "Grouping(" + strconv.Itoa(int(g)) + ")"
}

// Client runs pgquota's operations on a connection pool. It is safe for
// concurrent use by many goroutines.
//
// The calls that change quota and ledger state have a twin XTx that runs
// inside the caller's pgx.Tx (GrantTx, CompensateGrantTx, ...; and in the
// capability packages voucher.Client.ClaimTx, lease.Client.AcquireTx,
// fence.Client.WriteRowTx, outbox.Client.EnqueueTx, ...), so the caller's
// own writes and pgquota's commit or roll back together. The exceptions
// own their transactions or wait between them: ReapLedger and Migrate
// here, and those their packages name (lease's AcquireWait, Keepalive,
// Do, Election, Reap and BumpEpoch; outbox's Relay and Reap).
type Client struct {
	pool *pgxpool.Pool
	// db runs single statements on pool and retries serialization failures
	// and deadlocks; the calls without a Tx suffix use it. Its errors that
	// leave the outcome unknown are marked ErrOutcomeUnknown (core.SentPool);
	// read-only calls use db.Reads(), whose errors are not.
	db      core.RetryPool
	queries *db.Queries
	// policy is how the calls without a Tx suffix retry (retry.go).
	policy core.RetryPolicy
	cfg    Config

	// m holds the instruments; nil without Config.MeterProvider (metrics.go).
	m *core.Metrics

	// coalescer queues Grant calls with Config.Grouping GroupByCounter
	// (coalesce.go).
	coalescer *coalescer
	// grouper queues Grant calls of any counter with Config.Grouping
	// GroupAcrossCounters, the default (groupcommit.go).
	grouper *grouper

	// kinds caches each quota's kind, to pick its grant statement (shape.go).
	kinds kindCache

	// testHookCoalesceSend, set by tests only, runs before each coalesced
	// statement with the number of calls it decides, after they were
	// marked as sent.
	testHookCoalesceSend func(n int)

	// testHookGroupSend, set by tests only, runs before each statement of
	// the group-commit path with the requests it decides.
	testHookGroupSend func(reqs []GrantRequest)
}

// New returns a Client on pool. cfg may be nil. It does not touch the
// database; call Migrate (or run `pgquota migrate up`) once, and CheckSchema
// when you want to fail fast on a schema that is behind.
//
// Behind a pooler in transaction mode (PgBouncer and the like) set
// cfg.Pooler to PoolerTransaction and pgx's DefaultQueryExecMode to
// pgx.QueryExecModeExec (default_query_exec_mode=exec in the connection
// string): pgquota then keeps no session state (no LISTEN, no session-level
// advisory locks, no prepared statements); Migrate excepted, which takes a session-level
// advisory lock: migrate on a direct connection.
//
// Errors: *InputError (ErrInvalidInput) naming the Config field (an unknown
// Config.Grouping, a bad Config.Pooler), or pgx's
// DefaultQueryExecMode when cfg.Pooler is PoolerTransaction and the pool's
// mode is unsafe behind such a pooler (PoolerMode.CheckExecMode).
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, core.Invalid("pool", "must not be nil")
	}
	c := &Client{pool: pool}
	if cfg != nil {
		c.cfg = *cfg
	}
	if c.cfg.RetryMaxElapsed == 0 {
		c.cfg.RetryMaxElapsed = DefaultRetryMaxElapsed
	}
	if err := checkPooler(c.cfg.Pooler); err != nil {
		return nil, err
	}
	if err := c.cfg.Pooler.CheckExecMode(pool.Config().ConnConfig.DefaultQueryExecMode); err != nil {
		return nil, err
	}
	k, err := core.New(pool, core.Options{RetryMaxElapsed: c.cfg.RetryMaxElapsed, MeterProvider: c.cfg.MeterProvider, MetricsQuotaName: c.cfg.MetricsQuotaName})
	if err != nil {
		return nil, err
	}
	c.db, c.queries, c.policy, c.m = k.DB, k.Queries, k.Policy, k.M
	if c.cfg.Grouping == GroupAcrossCounters && c.cfg.Coalesce && !c.cfg.GroupCommit {
		c.cfg.Grouping = GroupByCounter
	}
	switch c.cfg.Grouping {
	case GroupAcrossCounters:
		c.grouper = newGrouper(c)
	case GroupByCounter:
		c.coalescer = newCoalescer(c)
	case GroupNone:
	default:
		return nil, core.Invalid("Config.Grouping", "is %d: use GroupAcrossCounters, GroupByCounter or GroupNone", int(c.cfg.Grouping))
	}
	return c, nil
}

// Pool returns the pool the client was created with.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// Config returns the client's settings, with the defaults New filled in.
// The capability packages (quota/outbox, ...) build their clients on a
// Client's pool and settings.
func (c *Client) Config() Config { return c.cfg }

// Migrate applies every pending pgquota migration (goose, embedded in the
// binary; see package migrations). Replicas that call it at once wait for
// each other on the migration lock, and each migration is applied exactly
// once. It needs one connection of the pool, on a direct connection or a
// session-mode pooler (the lock is a session-level advisory lock), and a
// role that may create objects in the database (the schema's owner):
// application roles (migrations.AppRole) may not. It fails without
// applying anything, with an error wrapping ErrSchemaNewer or ErrSchemaGap,
// when the database has migrations this build does not know or misses
// one below its newest (see migrations.SchemaError for the way out).
// With Config.Pooler set to PoolerTransaction it refuses at once, with an
// *InputError naming Config.Pooler (ErrInvalidInput): the migration lock
// needs a session, which a transaction pooler does not keep; migrate
// through a client on a direct connection.
func (c *Client) Migrate(ctx context.Context) error {
	if c.cfg.Pooler == PoolerTransaction {
		return core.Invalid("Config.Pooler", "is %s: Migrate takes a session-level advisory lock (goose's), which a transaction-mode pooler does not keep; "+
			"migrate through a client on a direct connection to PostgreSQL or a session-mode pooler", PoolerTransaction)
	}
	_, err := migrations.UpPool(ctx, c.pool)
	return err
}

// CheckSchema returns nil when the database's pgquota schema is at the
// version this build needs, and a *SchemaVersionError otherwise: wrapping
// ErrSchemaMissing when the schema is missing or behind, ErrSchemaNewer
// when it has migrations this build does not know (a newer build migrated
// it), ErrSchemaGap when a migration below its newest is not applied; on a
// Citus worker node's database, a *migrations.CitusWorkerError
// (ErrCitusWorker) naming the coordinator to connect to instead. It
// takes no lock and needs SELECT on the version table only (the
// migrations.AppRole role has it). Other errors come from the database.
func (c *Client) CheckSchema(ctx context.Context) error {
	sqlDB := stdlib.OpenDBFromPool(c.pool)
	defer sqlDB.Close()
	st, err := migrations.ReadState(ctx, sqlDB)
	if err != nil {
		switch {
		case errors.Is(err, migrations.ErrCitusWorker):
			return err
		case migrations.IsUndefinedSchemaError(err):
			st = migrations.State{}
		default:
			return core.DBError("check schema", err)
		}
	}
	e := &SchemaVersionError{Have: st.Current, Want: migrations.Latest(), Unknown: st.Unknown(), Missing: st.Missing()}
	if e.Have != e.Want || len(e.Unknown) > 0 || len(e.Missing) > 0 {
		return e
	}
	return nil
}

// isNoRows reports whether err is pgx's "no rows in result set".
func isNoRows(err error) bool { return core.IsNoRows(err) }

// isForeignKeyViolation reports SQLSTATE 23503: a row referred to a quota
// or campaign that does not exist.
func isForeignKeyViolation(err error) bool { return core.SQLState(err) == "23503" }
