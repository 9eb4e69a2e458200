package quota

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Window is a quota's kind: a calendar window (hour, day, week, month),
// none (a lifetime cap), a fixed window of any length, a rolling window,
// or a rate with a burst.
type Window string

// The windows a quota can have. Boundaries are computed by the database
// clock in the quota's IANA time zone: day, week (ISO weeks, starting
// Monday) and month windows start at local midnight, so a day window is 23
// or 25 hours long on a daylight-saving change day; hour windows start at
// the local full hour. WindowNone is a lifetime cap that never resets.
const (
	WindowNone  Window = "none"
	WindowHour  Window = "hour"
	WindowDay   Window = "day"
	WindowWeek  Window = "week"
	WindowMonth Window = "month"
)

// Windows lists the calendar windows, shortest first, with WindowNone
// last (the shaped kinds, WindowRate, WindowFixed and WindowRolling, are
// Window.Shaped).
var Windows = []Window{WindowHour, WindowDay, WindowWeek, WindowMonth, WindowNone}

func (w Window) valid() bool {
	for _, v := range Windows {
		if w == v {
			return true
		}
	}
	return false
}

// Limit returns a pointer to n, for the optional limits that are *int64:
// Definition.DefaultLimit and GrantRequest.Limit. They are pointers
// because nil means "not given" (a grant's nil Limit lets the member's
// limit, then the quota's default apply; a nil DefaultLimit means no
// default), while Limit(0) is a limit of 0, which denies every grant.
//
//	client.DefineQuota(ctx, quota.Definition{Name: "api", Window: quota.WindowHour, DefaultLimit: quota.Limit(100)})
//	client.Grant(ctx, quota.GrantRequest{Quota: "api", Member: key, Amount: 1, Limit: quota.Limit(5)})
//
// It is the same as Go 1.26's new(int64(n)), and as the Int64 helpers of
// other SDKs (aws.Int64). It checks nothing: the call that takes the limit
// does (at least 0, at most MaxUnits).
func Limit(n int64) *int64 { return &n }

// Definition describes a quota for DefineQuota.
type Definition struct {
	// Name identifies the quota: 1 to MaxNameBytes bytes, no control
	// characters.
	Name string
	// Window is the period each counter covers. Required.
	Window Window
	// TimeZone is the IANA zone the window boundaries are cut in, such as
	// "Europe/Berlin"; it must be a zone the database knows
	// (pg_timezone_names) and is matched without regard to case. Defaults
	// to "UTC".
	TimeZone string
	// DefaultLimit is the limit for members without an override when a
	// grant names none (set it with Limit(n)). nil means no default: such
	// grants fail with ErrNoLimit. 0 is a valid limit that denies every
	// grant.
	DefaultLimit *int64
	// Period is, for WindowRate, the time in which DefaultLimit units are
	// granted (10 per second: DefaultLimit 10, Period 1s); for WindowFixed
	// and WindowRolling, the window's length. Required for those kinds,
	// not accepted for the others: 1ms to 36525 days, whole milliseconds.
	Period time.Duration
	// Burst (WindowRate only) is the most units granted at once; at least 1.
	// Defaults to the limit (DefaultLimit, or the member's limit).
	Burst int64
	// Origin (WindowFixed only) is where the windows are cut: window k is
	// [Origin + k*Period, Origin + (k+1)*Period), also for instants before
	// Origin. Whole milliseconds. Defaults to the Unix epoch (so a 1h
	// window starts at each full UTC hour, a 10s window at :00, :10, ...).
	Origin time.Time
	// ReplaceKind allows a redefinition to change the kind (Window) of an
	// existing quota, day to rate or day to hour say: its existing counters
	// are then deleted in the same statement (a rate's buckets and a
	// rolling window's grants when it becomes a rate or a rolling window
	// again), so every member starts from zero and no old counter comes
	// back if the quota is switched back; member limits stay. Without it such a redefinition fails with
	// ErrQuotaKindChange and changes nothing. A redefinition of the same
	// kind keeps the counters either way. Defaults to false.
	ReplaceKind bool
}

// Quota is a defined quota.
type Quota struct {
	Name         string `json:"quota"`
	Window       Window `json:"window"`
	TimeZone     string `json:"time_zone"`
	DefaultLimit *int64 `json:"default_limit"`
	// Period, Burst and Origin are the shape of a quota of kind rate,
	// fixed or rolling (see Definition); zero for calendar windows.
	Period    time.Duration `json:"-"`
	Burst     int64         `json:"burst"`
	Origin    time.Time     `json:"origin"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// MemberLimit is a per-member limit override.
type MemberLimit struct {
	Quota     string    `json:"quota"`
	Member    string    `json:"member"`
	Limit     int64     `json:"limit"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DefineQuota creates the quota, or redefines it when it exists. A
// redefinition of the same kind (Window) keeps the counters; a change of
// time zone (or of a fixed window's period or origin) starts new windows,
// hence new counters. A redefinition that changes the kind needs
// d.ReplaceKind, which deletes the quota's counters of every kind (see
// Definition.ReplaceKind).
//
// Errors: *InputError (ErrInvalidInput) for a bad name, window, time zone or
// default limit; ErrQuotaKindChange when the quota exists with another
// kind and d.ReplaceKind is false (nothing is written); ErrSchemaMissing;
// database errors.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call with the same definition.
func (c *Client) DefineQuota(ctx context.Context, d Definition) (Quota, error) {
	return c.defineQuota(ctx, c.db, d)
}

// DefineQuotaTx is DefineQuota inside the caller's transaction: it commits
// or rolls back with tx.
func (c *Client) DefineQuotaTx(ctx context.Context, tx pgx.Tx, d Definition) (Quota, error) {
	return c.defineQuota(ctx, tx, d)
}

func (c *Client) defineQuota(ctx context.Context, x db.DBTX, d Definition) (Quota, error) {
	if err := core.CheckName("quota name", d.Name); err != nil {
		return Quota{}, err
	}
	if d.Window.Shaped() {
		return c.defineShaped(ctx, x, d)
	}
	if d.Period != 0 || d.Burst != 0 || !d.Origin.IsZero() {
		return Quota{}, core.Invalid("window", "%q is a calendar window: period, burst and origin apply to windows rate, fixed and rolling", string(d.Window))
	}
	if d.Window == "" {
		return Quota{}, core.Invalid("window", "is required (one of hour, day, week, month, none, rate, fixed, rolling)")
	}
	if !d.Window.valid() {
		return Quota{}, core.Invalid("window", "%q is not one of hour, day, week, month, none, rate, fixed, rolling", string(d.Window))
	}
	tz := d.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	if err := core.CheckName("time zone", tz); err != nil {
		return Quota{}, err
	}
	var def pgtype.Int8
	if d.DefaultLimit != nil {
		if err := core.CheckUnits("default limit", *d.DefaultLimit, 0); err != nil {
			return Quota{}, err
		}
		def = pgtype.Int8{Int64: *d.DefaultLimit, Valid: true}
	}
	row, err := c.queries.QuotaDefine(ctx, x, db.QuotaDefineParams{
		Name:         d.Name,
		WindowUnit:   string(d.Window),
		TimeZone:     tz,
		DefaultLimit: def,
		ReplaceKind:  d.ReplaceKind,
	})
	if isNoRows(err) {
		// An unknown zone (bad input first), or a refused change of kind.
		known, kerr := c.queries.QuotaTimeZoneKnown(ctx, x, tz)
		if kerr != nil {
			return Quota{}, core.DBError("define quota", kerr)
		}
		if known {
			if err := c.kindChangeError(ctx, x, d); err != nil {
				return Quota{}, err
			}
		}
		return Quota{}, core.Invalid("time zone", "%q is not an IANA time zone the database knows (see pg_timezone_names)", tz)
	}
	if err != nil {
		return Quota{}, core.DBError("define quota", err)
	}
	c.kinds.Store(d.Name, d.Window)
	return quotaFromRow(db.QuotaRow(row)), nil
}

// kindChangeError is the error of a define statement that wrote nothing:
// ErrQuotaKindChange when the quota exists with a kind other than d's (and
// d.ReplaceKind is false), nil otherwise.
func (c *Client) kindChangeError(ctx context.Context, x db.DBTX, d Definition) error {
	unit, err := c.queries.QuotaKindGet(ctx, x, d.Name)
	if isNoRows(err) {
		return nil
	}
	if err != nil {
		return core.DBError("define quota", err)
	}
	if Window(unit) == d.Window || d.ReplaceKind {
		return nil
	}
	return core.Errorf("%w: quota %q is of kind %s, not %s; redefining its kind deletes its counters (every member starts from zero, none comes back when switched back, "+
		"member limits stay): set Definition.ReplaceKind (CLI: --replace-kind) to do that; nothing was changed", ErrQuotaKindChange, d.Name, unit, d.Window)
}

// Quota returns the quota named name.
//
// Errors: *InputError for a bad name; ErrQuotaNotFound; ErrSchemaMissing;
// database errors.
func (c *Client) Quota(ctx context.Context, name string) (Quota, error) {
	if err := core.CheckName("quota name", name); err != nil {
		return Quota{}, err
	}
	row, err := c.queries.QuotaGet(ctx, c.db.Reads(), name)
	if isNoRows(err) {
		return Quota{}, core.Errorf("%w: %q", ErrQuotaNotFound, name)
	}
	if err != nil {
		return Quota{}, core.DBError("get quota", err)
	}
	return c.withShape(ctx, quotaFromRow(row))
}

// Quotas lists every defined quota, ordered by name.
//
// Errors: ErrSchemaMissing; database errors.
func (c *Client) Quotas(ctx context.Context) ([]Quota, error) {
	rows, err := core.Retry(ctx, c.policy, func() ([]db.QuotaRow, error) { return c.queries.QuotaList(ctx, c.pool) })
	if err != nil {
		return nil, core.DBError("list quotas", err)
	}
	out := make([]Quota, len(rows))
	for i, r := range rows {
		out[i] = quotaFromRow(r)
	}
	return c.withShapes(ctx, out)
}

func quotaFromRow(r db.QuotaRow) Quota {
	q := Quota{
		Name:      r.Name,
		Window:    Window(r.WindowUnit),
		TimeZone:  r.TimeZone,
		CreatedAt: core.TimeFromPG(r.CreatedAt),
		UpdatedAt: core.TimeFromPG(r.UpdatedAt),
	}
	if r.DefaultLimit.Valid {
		v := r.DefaultLimit.Int64
		q.DefaultLimit = &v
	}
	return q
}

// SetMemberLimit sets a member's own limit for a quota, which applies to
// grants that name no limit, in place of the quota's default. limit 0 denies
// every grant to the member.
//
// Errors: *InputError for a bad quota name, member or limit;
// ErrQuotaNotFound; ErrSchemaMissing; database errors.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call.
func (c *Client) SetMemberLimit(ctx context.Context, quota, member string, limit int64) (MemberLimit, error) {
	return c.setMemberLimit(ctx, c.db, quota, member, limit)
}

// SetMemberLimitTx is SetMemberLimit inside the caller's transaction.
func (c *Client) SetMemberLimitTx(ctx context.Context, tx pgx.Tx, quota, member string, limit int64) (MemberLimit, error) {
	return c.setMemberLimit(ctx, tx, quota, member, limit)
}

func (c *Client) setMemberLimit(ctx context.Context, x db.DBTX, quota, member string, limit int64) (MemberLimit, error) {
	if err := core.CheckName("quota name", quota); err != nil {
		return MemberLimit{}, err
	}
	if err := core.CheckName("member", member); err != nil {
		return MemberLimit{}, err
	}
	if err := core.CheckUnits("limit", limit, 0); err != nil {
		return MemberLimit{}, err
	}
	row, err := c.queries.QuotaOverrideSet(ctx, x, db.QuotaOverrideSetParams{
		QuotaName: quota, Member: member, LimitValue: limit,
	})
	if isNoRows(err) {
		return MemberLimit{}, core.Errorf("%w: %q", ErrQuotaNotFound, quota)
	}
	if err != nil {
		if isForeignKeyViolation(err) {
			// The quota was there when the statement began: a concurrent
			// delete. Keep the database's error in the chain.
			return MemberLimit{}, core.Errorf("%w: %q: %w", ErrQuotaNotFound, quota, err)
		}
		return MemberLimit{}, core.DBError("set member limit", err)
	}
	return MemberLimit{Quota: row.QuotaName, Member: row.Member, Limit: row.LimitValue, UpdatedAt: core.TimeFromPG(row.UpdatedAt)}, nil
}

// ClearMemberLimit removes a member's own limit, so the quota's default
// applies again. It reports whether there was one.
//
// Errors: *InputError for a bad quota name or member; ErrSchemaMissing;
// database errors.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call.
func (c *Client) ClearMemberLimit(ctx context.Context, quota, member string) (bool, error) {
	return c.clearMemberLimit(ctx, c.db, quota, member)
}

// ClearMemberLimitTx is ClearMemberLimit inside the caller's transaction.
func (c *Client) ClearMemberLimitTx(ctx context.Context, tx pgx.Tx, quota, member string) (bool, error) {
	return c.clearMemberLimit(ctx, tx, quota, member)
}

func (c *Client) clearMemberLimit(ctx context.Context, x db.DBTX, quota, member string) (bool, error) {
	if err := core.CheckName("quota name", quota); err != nil {
		return false, err
	}
	if err := core.CheckName("member", member); err != nil {
		return false, err
	}
	n, err := c.queries.QuotaOverrideDelete(ctx, x, db.QuotaOverrideDeleteParams{QuotaName: quota, Member: member})
	if err != nil {
		return false, core.DBError("clear member limit", err)
	}
	return n > 0, nil
}

// MemberLimits lists a quota's per-member limits, ordered by member.
//
// Errors: *InputError for a bad quota name; ErrQuotaNotFound;
// ErrSchemaMissing; database errors.
func (c *Client) MemberLimits(ctx context.Context, quota string) ([]MemberLimit, error) {
	if err := core.CheckName("quota name", quota); err != nil {
		return nil, err
	}
	rows, err := core.Retry(ctx, c.policy, func() ([]db.PgquotaQuotaOverride, error) { return c.queries.QuotaOverrideList(ctx, c.pool, quota) })
	if err != nil {
		return nil, core.DBError("list member limits", err)
	}
	if len(rows) == 0 {
		// No overrides, or no quota: tell them apart.
		if _, err := c.queries.QuotaGet(ctx, c.db, quota); isNoRows(err) {
			return nil, core.Errorf("%w: %q", ErrQuotaNotFound, quota)
		} else if err != nil {
			return nil, core.DBError("list member limits", err)
		}
	}
	out := make([]MemberLimit, len(rows))
	for i, r := range rows {
		out[i] = MemberLimit{Quota: r.QuotaName, Member: r.Member, Limit: r.LimitValue, UpdatedAt: core.TimeFromPG(r.UpdatedAt)}
	}
	return out, nil
}
