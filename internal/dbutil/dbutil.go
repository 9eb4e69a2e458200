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
func WithTx(ctx context.Context, b Beginner, fn func(tx pgx.Tx) error) (err error) {
	tx, err := b.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rerr := tx.Rollback(rctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
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
