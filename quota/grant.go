package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
)

// GrantRequest asks for units of a quota for a member.
type GrantRequest struct {
	// Quota names a defined quota.
	Quota string
	// Member is who the units are for: a user id, an API key, a tenant.
	// 1 to MaxNameBytes bytes, no control characters.
	Member string
	// Amount is the number of units, at least 1 and at most MaxUnits. There
	// is no default: an amount computed as 0 is reported as an error rather
	// than turned into a grant. (The CLI's --amount defaults to 1.)
	Amount int64
	// Limit, when not nil, is the limit for this call: at least 0 (0 denies
	// every grant), at most MaxUnits. When nil, the member's own limit
	// applies (SetMemberLimit), else the quota's default limit.
	Limit *int64
}

// GrantResult is the outcome of a grant. A denial is a result, not an error.
type GrantResult struct {
	// Granted reports whether the units were granted.
	Granted bool   `json:"granted"`
	Quota   string `json:"quota"`
	Member  string `json:"member"`
	// Amount is the number of units asked for.
	Amount int64 `json:"amount"`
	// Used is the number of units the member has used in the window after
	// the call. After a denial it is read with a fresh snapshot, so it
	// includes a concurrent grant that won the race; Used + Amount > Limit
	// held when the denial was decided.
	Used int64 `json:"used"`
	// Limit is the limit the call was decided against.
	Limit int64 `json:"limit"`
	// Remaining is Limit - Used, or 0 when Used exceeds a since-lowered
	// Limit.
	Remaining int64 `json:"remaining"`
	// WindowStart and WindowEnd bound the window the counter belongs to,
	// [WindowStart, WindowEnd), as computed by the database clock in the
	// quota's time zone. Both are zero for WindowNone.
	WindowStart time.Time `json:"window_start,omitzero"`
	WindowEnd   time.Time `json:"window_end,omitzero"`
}

// Grant grants req.Amount units of req.Quota to req.Member if that keeps
// the member's counter for the current window at or below the limit, and
// denies it otherwise. It is one SQL statement and one round trip, also for
// a member's first grant in a window, and the limit holds under any number
// of concurrent callers: the check and the write are one conditional update
// (see queries/usage.sql and the PostgreSQL manual, section 13.2.1, on how
// READ COMMITTED re-checks an UPDATE's WHERE clause against the newest row
// version).
//
// Errors: *InputError (ErrInvalidInput) for a bad quota name, member,
// amount or limit; ErrQuotaNotFound; ErrNoLimit when no limit applies;
// ErrSchemaMissing; database errors (SQLSTATE kept). On any error nothing
// was written.
func (c *Client) Grant(ctx context.Context, req GrantRequest) (GrantResult, error) {
	return onPool(ctx, func() (GrantResult, error) { return c.grant(ctx, c.pool, req) })
}

// GrantTx is Grant inside the caller's transaction: the grant commits or
// rolls back with tx, together with the caller's own writes. In REPEATABLE
// READ or SERIALIZABLE transactions a concurrent grant on the same counter
// makes PostgreSQL fail the statement with SQLSTATE 40001; the error is
// returned unchanged and the caller retries its whole transaction.
func (c *Client) GrantTx(ctx context.Context, tx pgx.Tx, req GrantRequest) (GrantResult, error) {
	return c.grant(ctx, tx, req)
}

func (c *Client) grant(ctx context.Context, x db.DBTX, req GrantRequest) (GrantResult, error) {
	if err := checkName("quota name", req.Quota); err != nil {
		return GrantResult{}, err
	}
	if err := checkName("member", req.Member); err != nil {
		return GrantResult{}, err
	}
	if err := checkUnits("amount", req.Amount, 1); err != nil {
		return GrantResult{}, err
	}
	var limit pgtype.Int8
	if req.Limit != nil {
		if err := checkUnits("limit", *req.Limit, 0); err != nil {
			return GrantResult{}, err
		}
		limit = pgtype.Int8{Int64: *req.Limit, Valid: true}
	}
	row, err := c.queries.UsageGrant(ctx, x, db.UsageGrantParams{
		QuotaName:  req.Quota,
		Member:     req.Member,
		Amount:     req.Amount,
		LimitValue: limit,
	})
	if isNoRows(err) {
		return GrantResult{}, fmt.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
	}
	if err != nil {
		return GrantResult{}, dbError("grant", err)
	}
	if !row.HasLimit {
		return GrantResult{}, fmt.Errorf("%w (quota %q, member %q)", ErrNoLimit, req.Quota, req.Member)
	}
	return GrantResult{
		Granted:     row.Granted,
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Used:        row.Used,
		Limit:       row.LimitValue,
		Remaining:   max(row.LimitValue-row.Used, 0),
		WindowStart: timeFromPG(row.WindowStart),
		WindowEnd:   timeFromPG(row.WindowEnd),
	}, nil
}

// RevokeRequest gives units of a quota back.
type RevokeRequest struct {
	Quota  string
	Member string
	// Amount is the number of units to give back, at least 1. A counter
	// never goes below zero: when it holds fewer units, all are revoked.
	Amount int64
}

// RevokeResult is the outcome of a revoke.
type RevokeResult struct {
	Quota  string `json:"quota"`
	Member string `json:"member"`
	// Amount is the number of units asked for; Revoked the number given
	// back (less when the counter held fewer).
	Amount  int64 `json:"amount"`
	Revoked int64 `json:"revoked"`
	// Used is the member's counter in the window after the call.
	Used        int64     `json:"used"`
	WindowStart time.Time `json:"window_start,omitzero"`
	WindowEnd   time.Time `json:"window_end,omitzero"`
}

// Revoke gives back up to req.Amount units of the member's counter in the
// current window, never driving it below zero: a compensation for a grant
// whose work failed. It is one SQL statement.
//
// Errors: *InputError for a bad quota name, member or amount;
// ErrQuotaNotFound; ErrSchemaMissing; database errors. On any error nothing
// was written.
func (c *Client) Revoke(ctx context.Context, req RevokeRequest) (RevokeResult, error) {
	return onPool(ctx, func() (RevokeResult, error) { return c.revoke(ctx, c.pool, req) })
}

// RevokeTx is Revoke inside the caller's transaction.
func (c *Client) RevokeTx(ctx context.Context, tx pgx.Tx, req RevokeRequest) (RevokeResult, error) {
	return c.revoke(ctx, tx, req)
}

func (c *Client) revoke(ctx context.Context, x db.DBTX, req RevokeRequest) (RevokeResult, error) {
	if err := checkName("quota name", req.Quota); err != nil {
		return RevokeResult{}, err
	}
	if err := checkName("member", req.Member); err != nil {
		return RevokeResult{}, err
	}
	if err := checkUnits("amount", req.Amount, 1); err != nil {
		return RevokeResult{}, err
	}
	row, err := c.queries.UsageRevoke(ctx, x, db.UsageRevokeParams{
		QuotaName: req.Quota, Member: req.Member, Amount: req.Amount,
	})
	if isNoRows(err) {
		return RevokeResult{}, fmt.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
	}
	if err != nil {
		return RevokeResult{}, dbError("revoke", err)
	}
	return RevokeResult{
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Revoked:     row.UsedBefore - row.UsedAfter,
		Used:        row.UsedAfter,
		WindowStart: timeFromPG(row.WindowStart),
		WindowEnd:   timeFromPG(row.WindowEnd),
	}, nil
}

// Usage is a member's counter in the current window.
type Usage struct {
	Quota  string `json:"quota"`
	Member string `json:"member"`
	Used   int64  `json:"used"`
	// Limit is the limit that applies when a grant names none: the
	// member's own limit, else the quota's default. HasLimit is false when
	// neither exists.
	Limit       int64     `json:"limit"`
	HasLimit    bool      `json:"has_limit"`
	Remaining   int64     `json:"remaining"`
	WindowStart time.Time `json:"window_start,omitzero"`
	WindowEnd   time.Time `json:"window_end,omitzero"`
}

// Usage reads a member's counter in the current window.
//
// Errors: *InputError for a bad quota name or member; ErrQuotaNotFound;
// ErrSchemaMissing; database errors.
func (c *Client) Usage(ctx context.Context, quota, member string) (Usage, error) {
	if err := checkName("quota name", quota); err != nil {
		return Usage{}, err
	}
	if err := checkName("member", member); err != nil {
		return Usage{}, err
	}
	row, err := c.queries.UsageGet(ctx, c.pool, db.UsageGetParams{QuotaName: quota, Member: member})
	if isNoRows(err) {
		return Usage{}, fmt.Errorf("%w: %q", ErrQuotaNotFound, quota)
	}
	if err != nil {
		return Usage{}, dbError("usage", err)
	}
	u := Usage{
		Quota:       quota,
		Member:      member,
		Used:        row.Used,
		Limit:       row.LimitValue,
		HasLimit:    row.HasLimit,
		WindowStart: timeFromPG(row.WindowStart),
		WindowEnd:   timeFromPG(row.WindowEnd),
	}
	if u.HasLimit {
		u.Remaining = max(u.Limit-u.Used, 0)
	}
	return u, nil
}
