package core

import (
	"context"
	"errors"
	"strconv"
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

// IsRetryable reports whether err carries SQLSTATE 40001
// (serialization_failure) or 40P01 (deadlock_detected): quota.IsRetryable
// documents it.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "40001" || pgErr.Code == "40P01"
}

// RunInTx is quota.RunInTx, which documents it.
func RunInTx(ctx context.Context, db dbutil.TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	return RetryTx(ctx, RetryPolicy{MaxElapsed: DefaultRetryMaxElapsed, ResetCaches: CacheResetter(db)}, db, opts, fn)
}

// RetryTx runs fn in a transaction begun on db with opts, committed, and
// run again from BEGIN as p says (Retry): RunInTx and FencedTx.
func RetryTx(ctx context.Context, p RetryPolicy, db dbutil.TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	_, err := Retry(ctx, p, func() (struct{}, error) {
		return struct{}{}, dbutil.WithTxOptions(ctx, db, opts, fn)
	})
	return err
}

// RetryPolicy is how the calls that own their transaction retry.
//
// Besides serialization failures and deadlocks (IsRetryable, retried with
// backoff for up to MaxElapsed), one more failure is retried once, at
// once: a statement that pgx cached on the connection (its default
// QueryExecModeCacheStatement prepares each statement once per connection)
// has gone stale. After ALTER TABLE ... ALTER COLUMN ... TYPE, say, the
// server refuses to run a prepared statement whose result columns changed
// type ("cached plan must not change result type", SQLSTATE 0A000, from
// PostgreSQL's plan cache, src/backend/utils/cache/plancache.c); a server
// connection reset under pgx (DISCARD ALL, DEALLOCATE ALL) no longer has
// the statement (26000, invalid_sql_statement_name). pgx forgets the failed
// statement on the failed connection only; ResetCaches, when not nil,
// resets the statement caches of the pool's idle connections before the
// retry, so the retry, and the calls after it, prepare afresh. The failed
// statement's transaction was rolled back, so nothing was written.
type RetryPolicy struct {
	MaxElapsed  time.Duration
	ResetCaches func(ctx context.Context)
	M           *Metrics // counts the retries (metrics.go); nil for none
}

// IsStaleStatementError reports the errors RetryPolicy retries once after
// a cache reset. The plan cache's 0A000 is told from the code's other uses
// by the server routine that raises it (not translated, unlike the
// message), or else by its message.
func IsStaleStatementError(err error) bool {
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

// CacheResetter returns a function that resets the statement caches of
// x's idle connections when x is a *pgxpool.Pool or a *pgx.Conn whose pgx
// exec mode caches statements, and nil otherwise.
func CacheResetter(x any) func(ctx context.Context) {
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

// Retry runs op until it succeeds, fails with an error that p does not
// retry, ctx ends or p.MaxElapsed has passed. On giving up it returns op's
// last error (joined with ctx's error when ctx ended). The first attempt
// allocates nothing: the backoff starts after a failure.
func Retry[T any](ctx context.Context, p RetryPolicy, op func() (T, error)) (T, error) {
	v, err := op()
	if err != nil && IsStaleStatementError(err) && ctx.Err() == nil {
		if p.ResetCaches != nil {
			p.ResetCaches(ctx)
		}
		v, err = op()
	}
	if err == nil || !IsRetryable(err) {
		return v, err
	}
	first, n := err, 0
	defer func() { p.M.Retried(ctx, n, first, err) }()
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
		if time.Since(start)+wait > p.MaxElapsed {
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

// RetryPool runs single statements on the pool, each in its own implicit
// transaction, and runs a statement again when it fails with a
// serialization failure or deadlock, or once when its cached statement went
// stale (RetryPolicy): the statement's implicit transaction was rolled
// back, so running it again is exactly a retry of the whole transaction.
// The Client's calls without a Tx suffix use it. It never runs a statement
// again after an error that leaves its outcome unknown (ErrOutcomeUnknown,
// marked by SentPool): only errors the server reported are retried.
//
// Query is not retried: its errors arrive while rows are read, after the
// caller has seen some of them. The list reads wrap their whole read in
// retry instead.
type RetryPool struct {
	Pool   SentPool
	Policy RetryPolicy
}

// Reads returns r for read-only statements: their errors are never marked
// ErrOutcomeUnknown, since they change nothing.
func (r RetryPool) Reads() RetryPool {
	r.Pool.ReadOnly = true
	return r
}

func (r RetryPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return Retry(ctx, r.Policy, func() (pgconn.CommandTag, error) {
		return r.Pool.Exec(ctx, sql, args...)
	})
}

func (r RetryPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return r.Pool.Query(ctx, sql, args...)
}

func (r RetryPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return retryRow{r: r, ctx: ctx, sql: sql, args: args}
}

// retryRow runs its statement when scanned, retrying as RetryPool does.
type retryRow struct {
	r    RetryPool
	ctx  context.Context
	sql  string
	args []any
}

func (rr retryRow) Scan(dest ...any) error {
	_, err := Retry(rr.ctx, rr.r.Policy, func() (struct{}, error) {
		return struct{}{}, rr.r.Pool.QueryRow(rr.ctx, rr.sql, rr.args...).Scan(dest...)
	})
	return err
}

// ReadsOf returns x for read-only statements: the pool's reads() for the
// pool, x itself for a transaction.
func ReadsOf(x db.DBTX) db.DBTX {
	switch p := x.(type) {
	case RetryPool:
		return p.Reads()
	case SentPool:
		p.ReadOnly = true
		return p
	}
	return x
}

// SentPool runs each statement on a connection acquired from the pool for
// it, in the statement's implicit transaction, and decides whether an
// error leaves the outcome unknown (nothing written, or the outcome unknown): a failure to
// acquire a connection sent nothing; a statement's error is marked with
// ErrOutcomeUnknown when the statement may have reached the server and no
// reply said how it ended (dbutil.SentWithoutReply: not an error the server
// reported, not one pgx knows happened before sending; a context that ended
// after the statement was sent, a lost connection). With ReadOnly set, errors
// are never marked: the statements change nothing.
//
// With LockWait set, each statement runs with lock_timeout = LockWait: it
// is pipelined after SELECT set_config('lock_timeout', ..., true) in one
// implicit transaction (one round trip, one Sync: the PostgreSQL manual,
// section 55.2.4, "Pipelining"), so a statement that waits longer than
// LockWait for a row or key lock another transaction holds fails with
// SQLSTATE 55P03 (lock_not_available) and, its transaction rolled back,
// wrote nothing (IsLockWaitBounded). The setting ends with the statement's
// transaction.
type SentPool struct {
	Pool     *pgxpool.Pool
	ReadOnly bool
	LockWait time.Duration
}

// LockTimeoutSetting is the lock_timeout value of d, in whole
// milliseconds (at least 1).
func LockTimeoutSetting(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

// setLockTimeout is the statement SentPool pipelines before each of its
// statements when LockWait is set.
const setLockTimeout = "SELECT set_config('lock_timeout', $1, true)"

// IsLockWaitBounded reports SQLSTATE 55P03 (lock_not_available): a lock
// wait longer than lock_timeout (SentPool.LockWait) or a NOWAIT lock that
// another transaction held. The statement failed and its transaction
// rolled back.
func IsLockWaitBounded(err error) bool { return SQLState(err) == "55P03" }

// bounded sends sql after the lock_timeout setting, in one pipeline on
// conn; the caller reads the second result and closes the batch.
func (p SentPool) bounded(ctx context.Context, conn *pgxpool.Conn, sql string, args []any) pgx.BatchResults {
	b := &pgx.Batch{}
	b.Queue(setLockTimeout, LockTimeoutSetting(p.LockWait))
	b.Queue(sql, args...)
	br := conn.SendBatch(ctx, b)
	return br
}

func (p SentPool) mark(err error) error {
	if p.ReadOnly {
		return err
	}
	return dbutil.MarkOutcome(err)
}

func (p SentPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	conn, err := p.Pool.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err // nothing was sent
	}
	defer conn.Release()
	if p.LockWait > 0 {
		br := p.bounded(ctx, conn, sql, args)
		_, err := br.Exec()
		var tag pgconn.CommandTag
		if err == nil {
			tag, err = br.Exec()
		}
		return tag, p.mark(errors.Join(err, br.Close()))
	}
	tag, err := conn.Exec(ctx, sql, args...)
	return tag, p.mark(err)
}

func (p SentPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := p.Pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if p.LockWait > 0 {
		br := p.bounded(ctx, conn, sql, args)
		if _, err := br.Exec(); err != nil {
			err = errors.Join(err, br.Close())
			conn.Release()
			return nil, p.mark(err)
		}
		rows, err := br.Query()
		if err != nil {
			err = errors.Join(err, br.Close())
			conn.Release()
			return nil, p.mark(err)
		}
		return &sentRows{Rows: rows, p: p, batch: br, release: sync.OnceFunc(conn.Release)}, nil
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		conn.Release()
		return nil, p.mark(err)
	}
	return &sentRows{Rows: rows, p: p, release: sync.OnceFunc(conn.Release)}, nil
}

func (p SentPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return sentRow{p: p, ctx: ctx, sql: sql, args: args}
}

// sentRow runs its statement when scanned, as SentPool.Exec does.
type sentRow struct {
	p    SentPool
	ctx  context.Context
	sql  string
	args []any
}

func (sr sentRow) Scan(dest ...any) error {
	conn, err := sr.p.Pool.Acquire(sr.ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if sr.p.LockWait > 0 {
		br := sr.p.bounded(sr.ctx, conn, sr.sql, sr.args)
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(dest...)
		}
		return sr.p.mark(errors.Join(err, br.Close()))
	}
	return sr.p.mark(conn.QueryRow(sr.ctx, sr.sql, sr.args...).Scan(dest...))
}

// sentRows releases its connection when closed, and marks its error as
// SentPool does.
type sentRows struct {
	pgx.Rows
	p       SentPool
	release func()
	// batch, when not nil, is the pipeline the rows came from
	// (SentPool.LockWait): closing it reads the end of the implicit
	// transaction (its COMMIT), whose error Err reports.
	batch    pgx.BatchResults
	batchErr error
}

func (r *sentRows) Close() {
	r.Rows.Close()
	if r.batch != nil {
		r.batchErr = r.batch.Close()
		r.batch = nil
	}
	r.release()
}

func (r *sentRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return r.p.mark(err)
	}
	return r.p.mark(r.batchErr)
}

func (r *sentRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close() // the rows were read to the end: the connection goes back
	return false
}
