package quota

import (
	"fmt"

	"github.com/pgquota/pgquota/internal/core"
)

// MaxNameBytes is the longest quota name, member, campaign or voucher code
// accepted, in bytes of UTF-8: 255.
const MaxNameBytes = core.MaxNameBytes

// MaxUnits is the largest amount, limit or pool total accepted: 2^62 - 1.
// With both an amount and a counter at most MaxUnits, their sum (at most
// 2^63 - 2) never overflows PostgreSQL's bigint (at most 2^63 - 1).
const MaxUnits = core.MaxUnits

// checkGrantRequest is the one place a GrantRequest is checked: Grant,
// GrantTx, GrantBatch and GrantBatchTx call it (a coalesced or grouped
// Grant call is checked by Grant, and again as a request of the batch its
// statement runs), and grantFenced for the fields it reads. It reads no
// state, and returns the quota names req names: req.Quotas, or req.Quota
// alone.
//
// limits reports whether pgquota.grant_limits decides req: always for a
// grant against several quotas (req.Quotas), and for one quota of kind
// rate, fixed or rolling when the caller routes it there, which it learns
// from the database (shapedRoute, shapedRouteErr: the kind cache). The
// only rule it changes is the idempotency key's: refused (errKeyedShaped)
// when limits, else checked (checkKey).
//
// The checks that need the database stay where its reply is read: an
// undefined quota (ErrQuotaNotFound), no limit (ErrNoLimit), a rolling
// limit above MaxRollingLimit (grant, limitsOutcome), and a keyed grant
// the ledger statement finds is for a quota of kind rate, fixed or rolling
// (errKeyedShaped in grantKeyed).
func checkGrantRequest(req GrantRequest, limits bool) ([]string, error) {
	names := req.Quotas
	if len(names) == 0 {
		names = []string{req.Quota}
	} else {
		limits = true
		if req.Quota != "" {
			return nil, core.Invalid("quota", "set Quota or Quotas, not both")
		}
	}
	if len(names) > MaxQuotasPerGrant {
		return nil, core.Invalid("quotas", "at most %d quotas per grant, got %d", MaxQuotasPerGrant, len(names))
	}
	seen := make(map[string]bool, len(names))
	for i, n := range names {
		field := "quota name"
		if len(req.Quotas) > 0 {
			field = fmt.Sprintf("quotas[%d]", i)
		}
		if err := core.CheckName(field, n); err != nil {
			return nil, err
		}
		if seen[n] {
			return nil, core.Invalid(field, "names quota %q twice", n)
		}
		seen[n] = true
	}
	if err := core.CheckName("member", req.Member); err != nil {
		return nil, err
	}
	if err := core.CheckUnits("amount", req.Amount, 1); err != nil {
		return nil, err
	}
	if req.Limit != nil {
		if len(req.Quotas) > 0 {
			return nil, core.Invalid("limit", "a call's limit is not accepted with several quotas (set member limits instead)")
		}
		if err := core.CheckUnits("limit", *req.Limit, 0); err != nil {
			return nil, err
		}
	}
	if req.Idempotency.Key != "" {
		if limits {
			return nil, errKeyedShaped()
		}
		if _, err := checkKey(req.Idempotency, req.Quota); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// errKeyedShaped is the error of a keyed grant against several quotas or a
// quota of kind rate, fixed or rolling (pgquota.grant_keyed writes nothing
// for those kinds and reports the kind).
func errKeyedShaped() error {
	return core.Invalid("idempotency key", "not supported for a grant against several quotas or a quota of kind rate, fixed or rolling (only calendar quotas record keyed grants)")
}

// checkRevokeRequest is the one place a RevokeRequest is checked (Revoke,
// RevokeTx). It returns the idempotency key with its default scope filled
// in (zero when req has none). A quota of kind rate, fixed or rolling is
// refused where the database reports the kind (calendarOnlyError in
// revoke and revokeKeyed).
func checkRevokeRequest(req RevokeRequest) (IdempotencyKey, error) {
	if err := core.CheckName("quota name", req.Quota); err != nil {
		return IdempotencyKey{}, err
	}
	if err := core.CheckName("member", req.Member); err != nil {
		return IdempotencyKey{}, err
	}
	if err := core.CheckUnits("amount", req.Amount, 1); err != nil {
		return IdempotencyKey{}, err
	}
	if req.Idempotency.Key == "" {
		return IdempotencyKey{}, nil
	}
	return checkKey(req.Idempotency, req.Quota)
}
