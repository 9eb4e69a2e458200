package quota

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pgquota/pgquota/internal/core"
)

// DefaultRetryMaxElapsed is how long RunInTx, and a Client whose
// Config.RetryMaxElapsed is zero, keep retrying a serialization failure or
// deadlock. Waits grow from 2ms by a factor of 2 up to 100ms, each
// randomized by ±50% (jitter, so that the losers of one conflict do not
// collide again in lockstep); internal/core/retry.go runs them.
const DefaultRetryMaxElapsed = core.DefaultRetryMaxElapsed

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
func IsRetryable(err error) bool { return core.IsRetryable(err) }

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
// statement cached on the connection went stale (a column's type changed:
// PostgreSQL refuses the cached plan, SQLSTATE 0A000 or 26000), the statement caches of db's idle connections
// are reset and it runs once more. Any other error from fn rolls the
// transaction back and is returned as is.
//
// fn may run more than once, so it must not have effects outside the
// transaction (send an email, call a payment API); write them to the outbox
// with outbox.Client.EnqueueTx (package quota/outbox) instead, which commits or rolls back with the transaction.
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
	return core.RunInTx(ctx, db, opts, fn)
}
