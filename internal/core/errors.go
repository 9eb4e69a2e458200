package core

import (
	"errors"
	"fmt"
)

// The sentinel errors every pgquota package returns. Package quota and the
// capability packages re-export them with their documentation; test for
// them there, with errors.Is.
var (
	ErrInvalidInput         = errors.New("pgquota: invalid input")
	ErrQuotaNotFound        = errors.New("pgquota: quota not found")
	ErrQuotaKindChange      = errors.New("pgquota: redefinition changes the quota's kind")
	ErrNoLimit              = errors.New("pgquota: no limit: give one in the call, set a member limit, or define the quota with a default limit")
	ErrCampaignNotFound     = errors.New("pgquota: voucher campaign not found")
	ErrCampaignExists       = errors.New("pgquota: voucher campaign already exists")
	ErrSchemaMissing        = errors.New("pgquota: schema is missing or behind: run `pgquota migrate up`")
	ErrPermissionDenied     = errors.New("pgquota: permission denied")
	ErrIdempotencyKeyReused = errors.New("pgquota: idempotency key reused with a different request")
	ErrGrantNotFound        = errors.New("pgquota: grant not found in the ledger")
	ErrLeaseHeld            = errors.New("pgquota: lease is held")
	ErrLeaseLost            = errors.New("pgquota: lease lost")
	ErrLeaseNotFound        = errors.New("pgquota: lease not found")
	ErrFencedRowNotFound    = errors.New("pgquota: fenced row not found")
	ErrStaleToken           = errors.New("pgquota: stale fencing token")
	ErrTokenNotPresented    = errors.New("pgquota: no fencing token presented in this transaction")
	ErrWrongLease           = errors.New("pgquota: fencing token of another lease")
	ErrKeepaliveStopped     = errors.New("pgquota: keepalive stopped")
	ErrLeaseExpiring        = errors.New("pgquota: lease about to expire without a confirmed renewal")
	ErrGrantAbandoned       = errors.New("pgquota: coalesced grant abandoned after it was sent; its outcome goes to Config.OnAbandonedGrant")
	ErrNoLeader             = errors.New("pgquota: election has no leader")
)

// InputError describes a rejected argument; quota.InputError documents it.
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

// Invalid returns an *InputError for field, its reason formatted as by
// fmt.Sprintf.
func Invalid(field, format string, args ...any) error {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
