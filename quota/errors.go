package quota

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test for them with errors.Is; the typed errors below wrap
// them where a caller needs more data. Database failures that are not one of
// these keep their *pgconn.PgError in the chain (errors.As), so callers can
// read the SQLSTATE.
var (
	// ErrInvalidInput is wrapped by every *InputError: a call was given a
	// value it cannot accept, and nothing was written. Every call returns it
	// for bad arguments.
	ErrInvalidInput = errors.New("pgquota: invalid input")

	// ErrQuotaNotFound is returned by Grant, GrantTx, Revoke, RevokeTx,
	// Usage, Quota, SetMemberLimit, SetMemberLimitTx and MemberLimits when no
	// quota of that name has been defined.
	ErrQuotaNotFound = errors.New("pgquota: quota not found")

	// ErrNoLimit is returned by Grant, GrantTx and Usage when the call gives
	// no limit, the member has no override and the quota has no default
	// limit. Nothing is written.
	ErrNoLimit = errors.New("pgquota: no limit: give one in the call, set a member limit, or define the quota with a default limit")

	// ErrCampaignNotFound is returned by ClaimVoucher, ClaimVoucherTx,
	// ClaimCode, ClaimCodeTx and VoucherStatus when no campaign of that name
	// exists.
	ErrCampaignNotFound = errors.New("pgquota: voucher campaign not found")

	// ErrCampaignExists is returned by CreateVoucherPool and
	// CreateVoucherPoolTx when the campaign already exists with another
	// total or kind, and by ImportCodes and ImportCodesTx when the campaign
	// exists as a counted pool. A repeated create with the same total is not
	// an error.
	ErrCampaignExists = errors.New("pgquota: voucher campaign already exists")

	// ErrCampaignKind is returned by ClaimVoucher and ClaimVoucherTx for a
	// code campaign, and by ClaimCode and ClaimCodeTx for a counted pool.
	ErrCampaignKind = errors.New("pgquota: wrong kind of voucher campaign")

	// ErrSchemaMissing is returned by every call that reaches the database
	// when the pgquota schema is missing or older than this build needs
	// (the PostgreSQL error stays in the chain). Run `pgquota migrate up`
	// or Client.Migrate. CheckSchema returns it wrapped in a
	// *SchemaVersionError.
	ErrSchemaMissing = errors.New("pgquota: schema is missing or behind: run `pgquota migrate up`")

	// ErrIdempotencyKeyReused is returned by Grant, GrantTx, Revoke,
	// RevokeTx, ClaimVoucherWithKey, ClaimVoucherWithKeyTx, ClaimCodeWithKey
	// and ClaimCodeWithKeyTx when the idempotency key (in its scope) was
	// first used for a different request: another operation, quota or
	// campaign, member, amount or limit. Nothing is written. The message
	// names the first request's grant id and the field that differs. (The
	// "Idempotency-Key" IETF draft answers this case with 422.)
	ErrIdempotencyKeyReused = errors.New("pgquota: idempotency key reused with a different request")

	// ErrGrantNotFound is returned by RevokeGrant and RevokeGrantTx when no
	// keyed grant has that grant id (grants without an idempotency key have
	// none, and reaped ledger rows are gone: see ReapLedger), and by
	// LedgerEntry and LedgerEntryByKey when no ledger entry matches.
	ErrGrantNotFound = errors.New("pgquota: grant not found in the ledger")
)

// InputError describes a rejected argument. It wraps ErrInvalidInput.
type InputError struct {
	// Field names the argument, as in the call's documentation ("member",
	// "amount", "limit", "time zone", ...).
	Field string
	// Reason says what is wrong with it, in a few words.
	Reason string
}

func (e *InputError) Error() string {
	return fmt.Sprintf("pgquota: invalid %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidInput.
func (e *InputError) Unwrap() error { return ErrInvalidInput }

func inputError(field, format string, args ...any) error {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// SchemaVersionError is returned by CheckSchema when the database's pgquota
// schema is not at the version this build needs. It wraps ErrSchemaMissing.
type SchemaVersionError struct {
	// Have is the database's migration version (0 when the schema is absent).
	Have int64
	// Want is the newest migration embedded in this build.
	Want int64
}

func (e *SchemaVersionError) Error() string {
	if e.Have == 0 {
		return "pgquota: schema is missing: run `pgquota migrate up`"
	}
	if e.Have > e.Want {
		return fmt.Sprintf("pgquota: schema is at version %d, newer than this build of pgquota (%d): upgrade pgquota", e.Have, e.Want)
	}
	return fmt.Sprintf("pgquota: schema is at version %d, this build needs %d: run `pgquota migrate up`", e.Have, e.Want)
}

// Unwrap returns ErrSchemaMissing when the schema is missing or behind, and
// nil when it is newer than this build.
func (e *SchemaVersionError) Unwrap() error {
	if e.Have > e.Want {
		return nil
	}
	return ErrSchemaMissing
}
