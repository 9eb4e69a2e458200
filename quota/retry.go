package quota

import (
	"context"
	"errors"
	"strings"
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
// A failed or cancelled transaction is rolled back under
// context.WithoutCancel with a short timeout, so a cancelled ctx never
// leaves a transaction open on a pooled connection.
//
// Use it around GrantTx and the other XTx calls when the transaction runs at
// REPEATABLE READ or SERIALIZABLE, or when the database's
// default_transaction_isolation is one of those.
func RunInTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	p := retryPolicy{maxElapsed: DefaultRetryMaxElapsed, resetCaches: cacheResetter(db)}
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
// The Client's calls without a Tx suffix use it.
//
// Query is not retried: its errors arrive while rows are read, after the
// caller has seen some of them. The list reads wrap their whole read in
// retry instead.
type retryPool struct {
	pool   db.DBTX
	policy retryPolicy
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
