package quota

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/dbutil"
)

// Retry bounds for transactions pgquota owns, and for RunInTx. Waits grow
// from retryInitial by a factor of 2 up to retryMaxInterval, each randomized
// by ±50% (jitter, so that the losers of one conflict do not collide again
// in lockstep).
const (
	retryInitial     = 2 * time.Millisecond
	retryMaxInterval = 100 * time.Millisecond
	// DefaultRetryMaxElapsed is how long RunInTx, and a Client whose
	// Config.RetryMaxElapsed is zero, keep retrying a serialization failure
	// or deadlock.
	DefaultRetryMaxElapsed = 30 * time.Second
)

// IsRetryable reports whether err carries one of the two PostgreSQL errors
// after which running the whole transaction again is safe and may succeed:
// SQLSTATE 40001 (serialization_failure, raised in REPEATABLE READ and
// SERIALIZABLE transactions when a concurrent transaction changed what this
// one read or writes) and 40P01 (deadlock_detected). PostgreSQL has rolled
// the transaction back in both cases (the manual, section 13.4, "Serializable
// Isolation Level", and Appendix A).
//
// pgquota retries these itself where it owns the transaction (every call
// without a Tx suffix). The XTx calls return them unchanged, since only the
// caller can run its whole transaction again: use RunInTx, or test with
// IsRetryable.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "40001" || pgErr.Code == "40P01"
}

// TxBeginner is what RunInTx needs to begin a transaction: a
// *pgxpool.Pool or a *pgx.Conn.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// RunInTx begins a transaction with opts, runs fn in it and commits. When
// the transaction fails with a serialization failure or a deadlock
// (IsRetryable), at fn's statements or at commit, it is rolled back and
// run again from the start, with exponential backoff and jitter, for up to
// DefaultRetryMaxElapsed or until ctx ends. When it fails because a
// statement cached on the connection went stale (see retryPolicy: a
// column's type changed), the statement caches of db's idle connections
// are reset and it runs once more. Any other error from fn rolls the
// transaction back and is returned as is.
//
// fn may run more than once, so it must not have effects outside the
// transaction (send an email, call a payment API); write them to the outbox
// with EnqueueTx instead, which commits or rolls back with the transaction.
//
// When the COMMIT was sent and no reply said how it ended (the connection
// was lost, ctx ended meanwhile), the error wraps ErrOutcomeUnknown: the
// transaction may have committed, and it is not run again. Learn its
// outcome by reading what it wrote, or make fn idempotent with keys
// (GrantTx with GrantRequest.Idempotency) and run it again. Any other error
// means nothing was committed.
//
// A failed or cancelled transaction is rolled back under
// context.WithoutCancel with a short timeout, so a cancelled ctx never
// leaves a transaction open on a pooled connection.
//
// Use it around GrantTx and the other XTx calls when the transaction runs at
// REPEATABLE READ or SERIALIZABLE, or when the database's
// default_transaction_isolation is one of those.
func RunInTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	return retryTx(ctx, retryPolicy{maxElapsed: DefaultRetryMaxElapsed, resetCaches: cacheResetter(db)}, db, opts, fn)
}

// retryTx runs fn in a transaction begun on db with opts, committed, and
// run again from BEGIN as p says (retry): RunInTx and FencedTx.
func retryTx(ctx context.Context, p retryPolicy, db TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	_, err := retry(ctx, p, func() (struct{}, error) {
		return struct{}{}, dbutil.WithTxOptions(ctx, db, opts, fn)
	})
	return err
}

// retryPolicy is how the calls that own their transaction retry.
//
// Besides serialization failures and deadlocks (IsRetryable, retried with
// backoff for up to maxElapsed), one more failure is retried once, at
// once: a statement that pgx cached on the connection (its default
// QueryExecModeCacheStatement prepares each statement once per connection)
// has gone stale. After ALTER TABLE ... ALTER COLUMN ... TYPE, say, the
// server refuses to run a prepared statement whose result columns changed
// type ("cached plan must not change result type", SQLSTATE 0A000, from
// PostgreSQL's plan cache, src/backend/utils/cache/plancache.c); a server
// connection reset under pgx (DISCARD ALL, DEALLOCATE ALL) no longer has
// the statement (26000, invalid_sql_statement_name). pgx forgets the failed
// statement on the failed connection only; resetCaches, when not nil,
// resets the statement caches of the pool's idle connections before the
// retry, so the retry, and the calls after it, prepare afresh. The failed
// statement's transaction was rolled back, so nothing was written.
type retryPolicy struct {
	maxElapsed  time.Duration
	resetCaches func(ctx context.Context)
	m           *metrics // counts the retries (metrics.go); nil for none
}

// isStaleStatementError reports the errors retryPolicy retries once after
// a cache reset. The plan cache's 0A000 is told from the code's other uses
// by the server routine that raises it (not translated, unlike the
// message), or else by its message.
func isStaleStatementError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "0A000":
		return pgErr.Routine == "RevalidateCachedQuery" || strings.Contains(pgErr.Message, "cached plan must not change result type")
	case "26000":
		return true
	}
	return false
}

// cacheResetter returns a function that resets the statement caches of
// x's idle connections when x is a *pgxpool.Pool or a *pgx.Conn whose pgx
// exec mode caches statements, and nil otherwise.
func cacheResetter(x any) func(ctx context.Context) {
	caching := func(cfg *pgx.ConnConfig) bool {
		m := cfg.DefaultQueryExecMode
		return m == pgx.QueryExecModeCacheStatement || m == pgx.QueryExecModeCacheDescribe
	}
	switch x := x.(type) {
	case *pgxpool.Pool:
		if !caching(x.Config().ConnConfig) {
			return nil
		}
		return func(ctx context.Context) {
			for _, conn := range x.AcquireAllIdle(ctx) {
				// DeallocateAll empties pgx's statement and description
				// caches and deallocates the connection's prepared
				// statements. A connection it fails on is broken: the
				// pool drops it on release.
				_ = conn.Conn().DeallocateAll(ctx)
				conn.Release()
			}
		}
	case *pgx.Conn:
		if !caching(x.Config()) {
			return nil
		}
		return func(ctx context.Context) {
			if x.PgConn().TxStatus() == 'I' {
				_ = x.DeallocateAll(ctx)
			}
		}
	}
	return nil
}

// retry runs op until it succeeds, fails with an error that p does not
// retry, ctx ends or p.maxElapsed has passed. On giving up it returns op's
// last error (joined with ctx's error when ctx ended). The first attempt
// allocates nothing: the backoff starts after a failure.
func retry[T any](ctx context.Context, p retryPolicy, op func() (T, error)) (T, error) {
	v, err := op()
	if err != nil && isStaleStatementError(err) && ctx.Err() == nil {
		if p.resetCaches != nil {
			p.resetCaches(ctx)
		}
		v, err = op()
	}
	if err == nil || !IsRetryable(err) {
		return v, err
	}
	first, n := err, 0
	defer func() { p.m.retried(ctx, n, first, err) }()
	start := time.Now()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     retryInitial,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         retryMaxInterval,
	}
	b.Reset()
	for {
		wait := b.NextBackOff()
		if time.Since(start)+wait > p.maxElapsed {
			return v, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, errors.Join(context.Cause(ctx), err)
		case <-t.C:
		}
		v, err = op()
		n++
		if err == nil || !IsRetryable(err) {
			return v, err
		}
	}
}

// retryPool runs single statements on the pool, each in its own implicit
// transaction, and runs a statement again when it fails with a
// serialization failure or deadlock, or once when its cached statement went
// stale (retryPolicy): the statement's implicit transaction was rolled
// back, so running it again is exactly a retry of the whole transaction.
// The Client's calls without a Tx suffix use it. It never runs a statement
// again after an error that leaves its outcome unknown (ErrOutcomeUnknown,
// marked by sentPool): only errors the server reported are retried.
//
// Query is not retried: its errors arrive while rows are read, after the
// caller has seen some of them. The list reads wrap their whole read in
// retry instead.
type retryPool struct {
	pool   sentPool
	policy retryPolicy
}

// reads returns r for read-only statements: their errors are never marked
// ErrOutcomeUnknown, since they change nothing.
func (r retryPool) reads() retryPool {
	r.pool.reads = true
	return r
}

func (r retryPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return retry(ctx, r.policy, func() (pgconn.CommandTag, error) {
		return r.pool.Exec(ctx, sql, args...)
	})
}

func (r retryPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return r.pool.Query(ctx, sql, args...)
}

func (r retryPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return retryRow{r: r, ctx: ctx, sql: sql, args: args}
}

// retryRow runs its statement when scanned, retrying as retryPool does.
type retryRow struct {
	r    retryPool
	ctx  context.Context
	sql  string
	args []any
}

func (rr retryRow) Scan(dest ...any) error {
	_, err := retry(rr.ctx, rr.r.policy, func() (struct{}, error) {
		return struct{}{}, rr.r.pool.QueryRow(rr.ctx, rr.sql, rr.args...).Scan(dest...)
	})
	return err
}

// readsOf returns x for read-only statements: the pool's reads() for the
// pool, x itself for a transaction.
func readsOf(x db.DBTX) db.DBTX {
	switch p := x.(type) {
	case retryPool:
		return p.reads()
	case sentPool:
		p.reads = true
		return p
	}
	return x
}

// sentPool runs each statement on a connection acquired from the pool for
// it, in the statement's implicit transaction, and decides whether an
// error leaves the outcome unknown (nothing written, or the outcome unknown): a failure to
// acquire a connection sent nothing; a statement's error is marked with
// ErrOutcomeUnknown when the statement may have reached the server and no
// reply said how it ended (dbutil.SentWithoutReply: not an error the server
// reported, not one pgx knows happened before sending; a context that ended
// after the statement was sent, a lost connection). With reads set, errors
// are never marked: the statements change nothing.
type sentPool struct {
	pool  *pgxpool.Pool
	reads bool
}

func (p sentPool) mark(err error) error {
	if p.reads {
		return err
	}
	return dbutil.MarkOutcome(err)
}

func (p sentPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err // nothing was sent
	}
	defer conn.Release()
	tag, err := conn.Exec(ctx, sql, args...)
	return tag, p.mark(err)
}

func (p sentPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		conn.Release()
		return nil, p.mark(err)
	}
	return &sentRows{Rows: rows, p: p, release: sync.OnceFunc(conn.Release)}, nil
}

func (p sentPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return sentRow{p: p, ctx: ctx, sql: sql, args: args}
}

// sentRow runs its statement when scanned, as sentPool.Exec does.
type sentRow struct {
	p    sentPool
	ctx  context.Context
	sql  string
	args []any
}

func (sr sentRow) Scan(dest ...any) error {
	conn, err := sr.p.pool.Acquire(sr.ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return sr.p.mark(conn.QueryRow(sr.ctx, sr.sql, sr.args...).Scan(dest...))
}

// sentRows releases its connection when closed, and marks its error as
// sentPool does.
type sentRows struct {
	pgx.Rows
	p       sentPool
	release func()
}

func (r *sentRows) Close() {
	r.Rows.Close()
	r.release()
}

func (r *sentRows) Err() error { return r.p.mark(r.Rows.Err()) }

func (r *sentRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close() // the rows were read to the end: the connection goes back
	return false
}
