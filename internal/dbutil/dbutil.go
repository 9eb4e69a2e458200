// Package dbutil holds small helpers for running pgquota's statements.
package dbutil

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner is what WithTx needs: a *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx
// (which begins a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// rollbackTimeout bounds the rollback that follows a failed or cancelled
// transaction.
const rollbackTimeout = 5 * time.Second

// WithTx begins a transaction, runs fn in it and commits. When fn fails, the
// context ends or the commit fails, the transaction is rolled back under
// context.WithoutCancel with a short timeout, so a cancelled context never
// leaves a transaction open on a pooled connection.
func WithTx(ctx context.Context, b Beginner, fn func(tx pgx.Tx) error) error {
	tx, err := b.Begin(ctx)
	if err != nil {
		return err
	}
	return run(ctx, tx, fn)
}

// TxBeginner is what WithTxOptions needs: a *pgxpool.Pool or a *pgx.Conn.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// WithTxOptions is WithTx for a transaction begun with opts (isolation
// level, access mode).
func WithTxOptions(ctx context.Context, b TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	return run(ctx, tx, fn)
}

// run runs fn in tx and commits, or rolls back as WithTx describes.
func run(ctx context.Context, tx pgx.Tx, fn func(tx pgx.Tx) error) (err error) {
	defer func() {
		if err == nil {
			return
		}
		Rollback(ctx, tx, &err)
	}()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Rollback rolls tx back under context.WithoutCancel(ctx) with a short
// timeout, and joins a rollback failure (other than an already closed
// transaction, or a connection that was closed before) to *err.
func Rollback(ctx context.Context, tx pgx.Tx, err *error) {
	// pgx closes the connection when a context ends mid-statement, and
	// PostgreSQL rolls back a transaction whose connection is gone: the
	// rollback then fails for no reason worth reporting. It is still called,
	// since it returns a pooled connection to its pool.
	closed := tx.Conn().IsClosed()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if rerr := tx.Rollback(rctx); rerr != nil && !closed && !errors.Is(rerr, pgx.ErrTxClosed) {
		*err = errors.Join(*err, fmt.Errorf("rollback: %w", rerr))
	}
}

// WithTxResult is WithTx for a function that returns a value.
func WithTxResult[T any](ctx context.Context, b Beginner, fn func(tx pgx.Tx) (T, error)) (T, error) {
	var out T
	err := WithTx(ctx, b, func(tx pgx.Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	return out, err
}
