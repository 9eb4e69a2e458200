package lease

import "github.com/pgquota/pgquota/internal/core"

// Sentinel errors of leases, keepalives and elections. Test for them with
// errors.Is.
var (
	// ErrHeld is returned by Acquire, AcquireTx and Do (without
	// DoRequest.Wait) when another acquisition attempt holds the lease,
	// wrapped in a *HeldError that names the holder and the expiry.
	// AcquireWait, Do with Wait and Election.Campaign return it only when
	// their context ends first.
	ErrHeld = core.ErrLeaseHeld

	// ErrLost is returned by Renew, RenewTx, Release, ReleaseTx,
	// SetPayload, SetPayloadTx and Leadership.Proclaim when the lease is no
	// longer held with the given token (it expired by the database clock,
	// was released, or another holder took it over), by package fence's
	// writes (WriteRow, WriteRowTx, PresentTokenTx, RunTx) when the lease
	// the write is checked against is not held with the token (SQLSTATE
	// PQ002), and is the cause of Keeper.Context (and so of the contexts Do
	// and Campaign give) when a renewal found the lease lost. A deposed
	// holder can neither extend, end, nor write under its successor's
	// lease.
	ErrLost = core.ErrLeaseLost

	// ErrNotFound is returned by Get when no lease of that name was ever
	// acquired, or its row was deleted by Reap.
	ErrNotFound = core.ErrLeaseNotFound

	// ErrKeepaliveStopped is the cause of a Keeper's context after
	// Keeper.Stop.
	ErrKeepaliveStopped = core.ErrKeepaliveStopped

	// ErrExpiring is the cause of a Keeper's context when no renewal was
	// confirmed in time: the context ends a safety margin before the last
	// expiry the database confirmed. The cause also wraps the last renewal
	// error, if any.
	ErrExpiring = core.ErrLeaseExpiring

	// ErrNoLeader is returned by Election.Leader when no campaigner holds
	// the election's lease (nobody ever won, or the last leader resigned or
	// lost it).
	ErrNoLeader = core.ErrNoLeader
)
