package quota

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// DefaultRetryMaxElapsed or until ctx ends. Any other error from fn rolls the
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
	_, err := retry(ctx, DefaultRetryMaxElapsed, func() (struct{}, error) {
		return struct{}{}, dbutil.WithTxOptions(ctx, db, opts, fn)
	})
	return err
}

// retry runs op until it succeeds, fails with an error that IsRetryable
// does not accept, ctx ends or maxElapsed has passed. On giving up it
// returns op's last error (joined with ctx's error when ctx ended). The
// first attempt allocates nothing: the backoff starts after a failure.
func retry[T any](ctx context.Context, maxElapsed time.Duration, op func() (T, error)) (T, error) {
	v, err := op()
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
		if time.Since(start)+wait > maxElapsed {
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
// serialization failure or deadlock: the statement's implicit transaction
// was rolled back, so running it again is exactly a retry of the whole
// transaction. The Client's calls without a Tx suffix use it.
//
// Query is not retried: its errors arrive while rows are read, after the
// caller has seen some of them. Only list reads use it.
type retryPool struct {
	pool       db.DBTX
	maxElapsed time.Duration
}

func (r retryPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return retry(ctx, r.maxElapsed, func() (pgconn.CommandTag, error) {
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
	_, err := retry(rr.ctx, rr.r.maxElapsed, func() (struct{}, error) {
		return struct{}{}, rr.r.pool.QueryRow(rr.ctx, rr.sql, rr.args...).Scan(dest...)
	})
	return err
}
