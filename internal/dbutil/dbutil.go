// Package dbutil holds small helpers for running pgquota's statements.
package dbutil

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// leaves a transaction open on a pooled connection. A COMMIT whose outcome
// is unknown (SentWithoutReply) fails with an error marked
// ErrOutcomeUnknown; every other error means nothing was committed.
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

// run runs fn in tx and commits, or rolls back as WithTx describes. A
// panic in fn rolls tx back (so its connection goes back to the pool, and
// no lock it took outlives the call) and goes on panicking.
func run(ctx context.Context, tx pgx.Tx, fn func(tx pgx.Tx) error) (err error) {
	panicked := true
	defer func() {
		if panicked {
			Rollback(ctx, tx, &err)
		}
	}()
	err = fn(tx)
	panicked = false
	if err != nil {
		Rollback(ctx, tx, &err)
		return err
	}
	// Commit ends the transaction whatever it returns, and a pooled
	// transaction's connection goes back to its pool then: no rollback (nor
	// any other use of tx.Conn()) after it, or another goroutine's
	// statement would race with ours on that connection.
	//
	// A statement of fn that failed without a reply left nothing behind:
	// pgx closed the connection, and PostgreSQL rolls back a transaction
	// whose connection is gone. Only the COMMIT's own lost reply leaves the
	// outcome unknown.
	if c := tx.Conn(); c != nil && c.PgConn().TxStatus() == 'I' {
		// fn ended the transaction by SQL (a COMMIT or ROLLBACK statement):
		// pgx does not know, and a COMMIT sent now would only draw a
		// warning (25P01) and a reply that says COMMIT.
		_ = tx.Rollback(ctx) // marks tx closed; nothing is open on the server
		return &outcomeUnknownError{err: errors.New("the transaction was ended by a statement of the function run in it (it must not commit or roll back itself), so whether its writes committed is unknown")}
	}
	err = tx.Commit(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		// fn ended the transaction itself (a COMMIT or ROLLBACK of its
		// own): whether its writes stand is not known here.
		return &outcomeUnknownError{err: fmt.Errorf("the transaction was ended by the function run in it (it must not commit or roll back itself), so whether its writes committed is unknown: %w", err)}
	}
	return MarkOutcome(err)
}

// Rollback rolls tx back under context.WithoutCancel(ctx) with a short
// timeout, and joins a rollback failure (other than an already closed
// transaction, or a connection that was closed before) to *err.
func Rollback(ctx context.Context, tx pgx.Tx, err *error) {
	// pgx closes the connection when a context ends mid-statement, and
	// PostgreSQL rolls back a transaction whose connection is gone: the
	// rollback then fails for no reason worth reporting. It is still called,
	// since it returns a pooled connection to its pool.
	//
	// The rollback comes first and the connection is looked at only when it
	// failed: after a Commit (which ends the transaction, also when it
	// fails) pgx answers ErrTxClosed without touching the connection, which
	// a pooled transaction has given back to its pool, where another
	// goroutine may be using it. A connection that failed its rollback is
	// closed, and the pool destroys it instead of handing it out.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	rerr := tx.Rollback(rctx)
	if rerr == nil || errors.Is(rerr, pgx.ErrTxClosed) {
		return
	}
	if !tx.Conn().IsClosed() {
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

// ErrOutcomeUnknown marks an error after which it is unknown whether the
// statement or COMMIT that failed took effect: it may have reached the
// server, and no reply said how it ended. Package quota exports it as
// quota.ErrOutcomeUnknown.
var ErrOutcomeUnknown = errors.New("pgquota: outcome unknown: the request may have been applied")

// outcomeUnknownError wraps an error after which the outcome is unknown.
// errors.Is(err, ErrOutcomeUnknown) holds for it, and the original error
// stays in the chain (errors.As, errors.Unwrap).
type outcomeUnknownError struct{ err error }

func (e *outcomeUnknownError) Error() string {
	return "outcome unknown, no reply said how the statement ended: " + e.err.Error()
}

func (e *outcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

func (e *outcomeUnknownError) Unwrap() error { return e.err }

// CitusCommitFailedPrefix begins the message of the error a Citus
// coordinator raises when a worker's one-phase COMMIT failed
// (ErrorIfPostCommitFailedShardPlacements in Citus's
// connection/placement_connection.c, after the WARNING "failed to commit
// transaction on HOST:PORT"): the worker may or may not have committed.
const CitusCommitFailedPrefix = "could not commit transaction for shard "

// SentWithoutReply reports whether err, returned by a statement that runs
// in its own implicit transaction or by a COMMIT, leaves its outcome
// unknown: the request may have reached the server and no reply said how
// it ended. That is every error except
//   - an error the server reported for the statement (a *pgconn.PgError of
//     severity ERROR: PostgreSQL rolled the statement back). A FATAL or
//     PANIC one ended the session instead, possibly after the commit (a
//     backend terminated or shut down while it sent the reply), so it
//     counts as unknown; so does a Citus coordinator's ERROR "could not
//     commit transaction for shard ..." (CitusCommitFailedPrefix): it
//     sent COMMIT to a worker (a transaction on one worker commits there
//     in one phase, before the coordinator's own commit) and got no reply,
//     so the worker may have committed;
//   - one that pgconn guarantees happened before anything was sent
//     (pgconn.SafeToRetry: a context that had already ended, a busy
//     connection), except pgconn.ErrConnClosed: pgx v5.12 also returns
//     that one, marked safe to retry, for a simple-protocol statement (a
//     COMMIT, any statement in simple_protocol exec mode) whose reply was
//     lost after it was sent, so it counts as unknown;
//   - a failed connection attempt (*pgconn.ConnectError);
//   - pgx.ErrNoRows (a reply: no row matched), and pgx.ErrTxClosed and
//     pgx.ErrTxCommitRollback (the transaction had already ended, or
//     COMMIT answered that it rolled back).
//
// A context that ended after the request was sent (context.Canceled,
// context.DeadlineExceeded: pgx then closes the connection) and a
// connection lost mid-request (unexpected EOF, a reset) are unknown.
func SentWithoutReply(err error) bool {
	if err == nil || errors.Is(err, ErrOutcomeUnknown) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.SeverityUnlocalized == "FATAL" || pgErr.SeverityUnlocalized == "PANIC" ||
			(pgErr.SeverityUnlocalized == "" && (pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC")) ||
			strings.HasPrefix(pgErr.Message, CitusCommitFailedPrefix)
	}
	var connectErr *pgconn.ConnectError
	switch {
	case errors.Is(err, pgconn.ErrConnClosed):
		return true
	case pgconn.SafeToRetry(err), errors.As(err, &connectErr),
		errors.Is(err, pgx.ErrNoRows), errors.Is(err, pgx.ErrTxClosed), errors.Is(err, pgx.ErrTxCommitRollback):
		return false
	}
	return true
}

// MarkOutcome returns err marked with ErrOutcomeUnknown when
// SentWithoutReply(err), and err unchanged otherwise.
func MarkOutcome(err error) error {
	if SentWithoutReply(err) {
		return &outcomeUnknownError{err: err}
	}
	return err
}
