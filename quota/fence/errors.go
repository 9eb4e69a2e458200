package fence

import "github.com/pgquota/pgquota/internal/core"

// Sentinel errors of fenced writes and guarded tables. Test for them with
// errors.Is. A write checked against a lease that is not held with its
// token returns lease.ErrLost (SQLSTATE PQ002).
var (
	// ErrRowNotFound is returned by Row when the resource has no row of
	// that key.
	ErrRowNotFound = core.ErrFencedRowNotFound

	// ErrStaleToken is returned by WriteRow, WriteRowTx, PresentTokenTx and
	// RunTx, and by MapError for an error from a guarded application table,
	// when the write's fencing token is below the highest token seen for
	// the resource (or below the token of the lease it is checked against).
	// It is wrapped in a *StaleTokenError. Nothing was written.
	ErrStaleToken = core.ErrStaleToken

	// ErrTokenNotPresented is returned by MapError (and RunTx, for fn's
	// statements) for an error from a table guarded by GuardTable (SQLSTATE
	// PQ003) when the statement ran in a transaction that presented no
	// fencing token for the table's resource (PresentTokenTx or SELECT
	// pgquota.present_token(...) first, in the same transaction), or one
	// that pgquota.present_token did not admit. Nothing of the statement
	// was written.
	ErrTokenNotPresented = core.ErrTokenNotPresented

	// ErrWrongLease is returned (by RunTx, and through MapError, SQLSTATE
	// PQ004, SQLStateWrongLease) when a fencing token is presented or
	// written for a resource bound to another lease or semaphore than the
	// one that issued it, or with a lease name for a resource that takes
	// external tokens only (see GuardTableRequest). Nothing was written and
	// no mark moved.
	ErrWrongLease = core.ErrWrongLease
)
