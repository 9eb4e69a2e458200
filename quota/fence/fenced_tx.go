package fence

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota/lease"
)

// TxRequest names the fencing token RunTx presents before it runs
// its function: the fields of PresentTokenRequest, and the transaction's
// options.
type TxRequest struct {
	// Resource is the guarded table's GuardedTable.Resource
	// ("public.orders"), or any fence resource: 1 to quota.MaxNameBytes bytes,
	// no control characters. Required.
	Resource string
	// Token is the writer's fencing token, at least 1: the Token of the
	// lease it holds (lease.Lease.Token, lease.FromContext inside lease.Client.Do), or the
	// external service's number for a table attached with External.
	// Required.
	Token int64
	// Lease names the pgquota lease that issued Token, as
	// PresentTokenRequest.Lease. Defaults to the lease the resource is
	// bound to (the lease named like Resource unless
	// GuardTableRequest.Lease said otherwise); for an External table,
	// empty means no lease is checked. For a resource no guard binds,
	// empty means only the highest token seen is checked (see
	// PresentTokenTx): set it to have the lease checked too.
	Lease string
	// TxOptions begins the transaction (isolation level, access mode).
	// Defaults to the zero pgx.TxOptions: the database's default isolation
	// (READ COMMITTED unless default_transaction_isolation says otherwise).
	TxOptions pgx.TxOptions
}

// RunTx runs fn in a transaction of its own in which req.Token is
// presented for req.Resource, so that fn's statements on a table guarded
// by GuardTable with that resource land, stamped with the token, and a
// holder whose lease was taken over writes nothing. It is the hand-written
// sequence of pgx.BeginFunc, PresentTokenTx, fn, COMMIT and MapError
// in one call:
//
//  1. begin a transaction on the client's pool with req.TxOptions;
//  2. PresentTokenTx: the lease (of the resource's guard, or req.Lease)
//     must be held with req.Token by the database clock; its row stays
//     locked FOR KEY SHARE until the transaction ends,
//     so no successor's acquire lands before the commit (the holder's own
//     renewals do not wait);
//  3. run fn(tx), which must not commit or roll back tx;
//  4. commit, or roll back when step 2 or 3 failed (under
//     context.WithoutCancel with a short timeout, so an ended ctx never
//     leaves the transaction open).
//
// When the transaction fails with a serialization failure or a deadlock
// (IsRetryable, SQLSTATE 40001 or 40P01) it is rolled back and run again
// from step 1, with backoff, for up to quota.Config.RetryMaxElapsed or until ctx
// ends, as quota.RunInTx does: fn may run more than once, so keep effects
// outside the database out of it (write them to the outbox with
// outbox.Client.EnqueueTx). fn runs not at all when the token is refused.
//
// Returns nil when the transaction committed. Errors, each meaning nothing
// was committed unless it wraps quota.ErrOutcomeUnknown:
//   - *quota.InputError (quota.ErrInvalidInput) for a bad resource, token or lease
//     name, or a nil fn; nothing is sent.
//   - *StaleTokenError (ErrStaleToken, SQLSTATE PQ001): req.Token is below
//     the highest token seen for the resource, typically because a
//     successor acquired the lease; fn did not run.
//   - lease.ErrLost (PQ002): the lease is not held with req.Token (it
//     expired or was released and nobody took it since, or never issued
//     the token); fn did not run.
//   - ErrWrongLease (PQ004): the resource is bound to another lease or
//     semaphore than req.Lease names, or to external tokens while
//     req.Lease is set; fn did not run.
//   - fn's error, as fn returned it, when fn failed: the transaction was
//     rolled back. An error of one of fn's statements raised by pgquota's
//     fence (a guarded table of another resource, for which fn presented
//     no token: ErrTokenNotPresented, PQ003; or PQ001, PQ002, PQ004) also
//     matches the error MapError gives for it (errors.Is, errors.As),
//     keeping fn's own wrapping in its text.
//   - quota.ErrSchemaMissing when the schema predates pgquota.present_token;
//     quota.ErrPermissionDenied; other database errors (a failed BEGIN, a
//     failed COMMIT that the server reported), after the last retry for
//     40001 and 40P01.
//   - quota.ErrOutcomeUnknown: the COMMIT was sent and no reply said how it
//     ended (the connection was lost, ctx ended meanwhile): the
//     transaction may have committed, and it is not run again. Read what
//     fn wrote to learn the outcome, or make fn idempotent and call again.
//     A failure of one of fn's statements never leaves the outcome
//     unknown: PostgreSQL rolls back a transaction whose connection is
//     gone.
func (c *Client) RunTx(ctx context.Context, req TxRequest, fn func(tx pgx.Tx) error) error {
	if fn == nil {
		return core.Invalid("fn", "must not be nil")
	}
	present := PresentTokenRequest{Resource: req.Resource, Token: req.Token, Lease: req.Lease}
	if err := checkPresentToken(present); err != nil {
		return err
	}
	return core.RetryTx(ctx, c.core.Policy, c.core.Pool, req.TxOptions, func(tx pgx.Tx) error {
		if err := c.PresentTokenTx(ctx, tx, present); err != nil {
			return err
		}
		return mapFenceErrorOf(fn(tx))
	})
}

// checkPresentToken checks a PresentTokenRequest's fields, naming the bad
// one, before anything is sent.
func checkPresentToken(req PresentTokenRequest) error {
	if err := core.CheckName("resource", req.Resource); err != nil {
		return err
	}
	if err := core.CheckToken(req.Token); err != nil {
		return err
	}
	if req.Lease != "" {
		return core.CheckName("lease name", req.Lease)
	}
	return nil
}

// mapFenceErrorOf maps a fence error that fn returned (MapError),
// keeping fn's own wrapping: a bare *pgconn.PgError becomes MapError's
// error; a wrapped one becomes a *fnFenceError whose text is fn's and whose
// chain holds MapError's error first. An error already mapped (it
// matches one of the fence's sentinels), and any other error, is returned
// unchanged.
func mapFenceErrorOf(err error) error {
	if err == nil || errors.Is(err, ErrStaleToken) || errors.Is(err, lease.ErrLost) ||
		errors.Is(err, ErrTokenNotPresented) || errors.Is(err, ErrWrongLease) {
		return err
	}
	mapped := MapError(err)
	if mapped == err {
		return err
	}
	if _, bare := err.(*pgconn.PgError); bare {
		return mapped
	}
	return &fnFenceError{err: err, mapped: mapped}
}

// fnFenceError is a fence error fn returned wrapped in its own context.
type fnFenceError struct {
	err    error // as fn returned it
	mapped error // MapError(err)
}

func (e *fnFenceError) Error() string { return e.err.Error() }

// Unwrap returns MapError's error, then fn's.
func (e *fnFenceError) Unwrap() []error { return []error{e.mapped, e.err} }
