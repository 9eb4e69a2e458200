package quota

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
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
	// Limit, when not nil, is the limit for this call (set it with
	// Limit(n)): at least 0 (0 denies every grant), at most MaxUnits. When
	// nil, the member's own limit applies (SetMemberLimit), else the
	// quota's default limit.
	Limit *int64
	// Idempotency, when its Key is set, makes the grant safe to repeat: it
	// is recorded in the grant ledger under a grant id, and a repeat with
	// the same key and request returns the first outcome without granting
	// again. Its Scope defaults to Quota. See IdempotencyKey. Not
	// accepted (ErrInvalidInput) with Quotas or for quotas of kind rate,
	// fixed or rolling.
	Idempotency IdempotencyKey
	// Quotas, when set (instead of Quota), checks the grant against every
	// quota named (at most MaxQuotasPerGrant, each once, of any kinds) in
	// one statement: the amount is granted under all of them or none.
	// GrantResult.DeniedBy names the quota that refused (with the
	// longest RetryAfter when several did) and Limits holds each quota's
	// outcome. Limit must be nil (member limits apply per quota).
	Quotas []string
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
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// Keyed is the ledger record of a grant made with an idempotency key:
	// its grant id (for CompensateGrant and outbox events), the key, and
	// whether this result was replayed. Zero for a grant without a key.
	Keyed
	// RetryAfter is how long after DecidedAt the same grant can succeed:
	// 0 when granted, Never when no wait helps (an amount above the limit
	// or a rate's burst, a limit of 0 for a rate, a full lifetime counter
	// of WindowNone), else for a calendar or fixed window the time to
	// WindowEnd. ResetAfter is how long until every quota is back at its
	// full limit (a calendar window: WindowEnd; Never for WindowNone). Both
	// are from the database clock, rounded up to the microsecond, for
	// grants of every kind, alone or in a batch (GrantBatch, grouped
	// calls), as pgquota.grant and pgquota.grant_limits compute them
	// (docs/sql.md). DecidedAt is the database clock's instant
	// of the decision. A replayed keyed grant (Keyed.Replayed) carries the
	// first call's DecidedAt, RetryAfter and ResetAfter (as of DecidedAt,
	// not of the replay).
	//
	// DeniedBy and Limits are set by grants against several quotas, or a
	// quota of kind rate, fixed or rolling (grant_multi.go): DeniedBy names
	// the quota that refused ("" when granted), Limits holds each quota's
	// outcome. Both are zero for calendar grants on their own.
	RetryAfter time.Duration `json:"-"`
	ResetAfter time.Duration `json:"-"`
	DecidedAt  time.Time     `json:"decided_at"`
	DeniedBy   string        `json:"denied_by"`
	Limits     []LimitResult `json:"limits"`
}

// Grant grants req.Amount units of req.Quota to req.Member if that keeps
// the member's counter for the current window at or below the limit, and
// denies it otherwise. It is one SQL statement and one round trip, also for
// a member's first grant in a window and for the first grant of a rate,
// fixed or rolling quota (the SQL function pgquota.grant serves every kind:
// docs/sql.md), and the limit holds under any number of concurrent
// callers: the check and the write are one conditional update (see
// migrations/00014_sql_interface.sql and the PostgreSQL manual, section
// 13.2.1, on how READ COMMITTED re-checks an UPDATE's WHERE clause against
// the newest row version).
//
// With req.Idempotency set, the grant and its ledger row are still one
// statement and one round trip (see queries/ledger.sql for why exactly one
// of any number of concurrent copies grants); a repeat with the same key
// and request returns the stored first outcome (Replayed set, a denial
// included) and changes nothing, and a repeat with the same key and another
// request fails with ErrIdempotencyKeyReused.
//
// Serialization failures and deadlocks (possible when the database's
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE) are
// retried for up to Config.RetryMaxElapsed (see IsRetryable).
//
// When the statement was sent and no reply said how it ended (ctx ended
// while it ran, so pgx closed the connection; the connection was lost; the
// server shut down), the error wraps ErrOutcomeUnknown and the original
// error: PostgreSQL may have committed the statement. Repeat the call with
// the same idempotency key to learn the outcome (an unkeyed repeat may
// grant twice), or read the counter (Usage). (With pgx's
// CancelRequestContextWatcherHandler in the pool's configuration, pgx asks
// the server to cancel the statement instead, and the error is then
// PostgreSQL's SQLSTATE 57014, query_canceled, when the cancel arrived in
// time: nothing was written.)
//
// Concurrent calls of one Client share a statement and a commit (group
// commit: Config.Grouping, GroupAcrossCounters by default; groupcommit.go),
// or with idempotency keys one transaction in which each keyed call still
// gets its own ledger entry and grant id. A call that finds no statement
// of the client in flight runs alone, on its own statement. The outcome
// of each call is the same as without grouping, and the errors are those
// of GrantBatch for one request, plus the context's error when ctx ends
// before the call was sent (nothing granted), or ErrGrantAbandoned
// (wrapping ErrOutcomeUnknown) when it ends after (a keyed call's outcome
// is then in the ledger: repeat the call with its key). A group waits at
// most 100 ms for a counter another transaction holds locked, then splits
// by counter: only the held counter's calls wait for it.
//
// Errors: *InputError (ErrInvalidInput) for a bad quota name, member,
// amount, limit or idempotency key; ErrQuotaNotFound; ErrNoLimit when no
// limit applies; ErrIdempotencyKeyReused; ErrSchemaMissing; the context's
// error; database errors (SQLSTATE kept); ErrOutcomeUnknown, as above. On
// any other error nothing was written.
func (c *Client) Grant(ctx context.Context, req GrantRequest) (res GrantResult, err error) {
	defer c.grantDone(ctx, core.OpGrant, c.m.Now(), &req, &res, &err)
	// The request is checked once, here (checkGrantRequest, validate.go).
	// Several quotas at once take pgquota.grant_limits (grant_multi.go),
	// which refuses a key; so do rates, fixed durations and rolling
	// windows where the group commit or the coalescer takes the call (their
	// batches go through pgquota.grant_limits_batch, batch_limits.go), so
	// their kind is read first (shapedRoute). The plain path needs no
	// kind: pgquota.grant serves every kind, pgquota.grant_keyed reports
	// it (grantKeyed).
	// The group commit reads the kind only for a call it queues (a lone
	// call takes the plain path): grouper.grant checks it then.
	limits := (len(req.Quotas) > 0 || c.coalescer != nil) && c.shapedRoute(ctx, c.db.Reads(), req)
	if _, err := checkGrantRequest(req, limits); err != nil {
		return GrantResult{}, err
	}
	if c.grouper != nil && groupable(req) {
		return c.grouper.grant(ctx, req)
	}
	if c.coalescer != nil && len(req.Quotas) == 0 {
		return c.coalescer.grant(ctx, req)
	}
	return c.grant(ctx, c.db, req)
}

// GrantTx is Grant inside the caller's transaction: the grant commits or
// rolls back with tx, together with the caller's own writes. In REPEATABLE
// READ or SERIALIZABLE transactions a concurrent grant on the same counter
// makes PostgreSQL fail the statement with SQLSTATE 40001 (and lock waits
// between transactions can end in a deadlock, 40P01); the error is
// returned unchanged (IsRetryable reports it) and the caller retries its
// whole transaction, for instance with RunInTx.
//
// With an idempotency key, the key stays locked by tx until it ends: a
// concurrent call with the same key waits for tx, then replays its outcome
// if tx committed, or grants itself if tx rolled back.
func (c *Client) GrantTx(ctx context.Context, tx pgx.Tx, req GrantRequest) (res GrantResult, err error) {
	defer c.grantDone(ctx, core.OpGrantTx, c.m.Now(), &req, &res, &err)
	// No kind is needed: pgquota.grant serves every kind, and
	// pgquota.grant_keyed reports a key for a rate, fixed or rolling
	// quota (grantKeyed).
	if _, err := checkGrantRequest(req, false); err != nil {
		return GrantResult{}, err
	}
	return c.grant(ctx, tx, req)
}

// grant runs one grant request, validated by its caller (Grant, GrantTx,
// GrantBatch), with checkGrantRequest, the only place requests are
// checked. One statement for a quota of any kind: pgquota.grant (UsageGrant)
// delegates rates, fixed and rolling windows to pgquota.grant_limits.
func (c *Client) grant(ctx context.Context, x db.DBTX, req GrantRequest) (GrantResult, error) {
	if len(req.Quotas) > 0 {
		return c.grantLimits(ctx, x, req)
	}
	if req.Idempotency.Key != "" {
		return c.grantKeyed(ctx, x, fingerprint(req))
	}
	var limit pgtype.Int8
	if req.Limit != nil {
		limit = pgtype.Int8{Int64: *req.Limit, Valid: true}
	}
	row, err := c.queries.UsageGrant(ctx, x, db.UsageGrantParams{
		QuotaName:  req.Quota,
		Member:     req.Member,
		Amount:     req.Amount,
		LimitValue: limit,
	})
	if err != nil {
		return GrantResult{}, core.DBError("grant", err)
	}
	if !row.Found {
		c.kinds.Delete(req.Quota)
		return GrantResult{}, core.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
	}
	w := Window(row.Kind)
	c.kinds.Store(req.Quota, w)
	switch {
	case !row.HasLimit:
		return GrantResult{}, core.Errorf("%w (quota %q, member %q)", ErrNoLimit, req.Quota, req.Member)
	case !row.DecidedAt.Valid && w == WindowRolling && row.LimitValue > MaxRollingLimit:
		return GrantResult{}, core.Invalid("limit", "of rolling quota %q for member %q is %d, at most %d is supported", req.Quota, req.Member, row.LimitValue, MaxRollingLimit)
	case !row.DecidedAt.Valid:
		return GrantResult{}, core.Errorf("pgquota: grant: quota %q of kind %s has no shape row", req.Quota, row.Kind)
	}
	res := GrantResult{
		Granted:     row.Granted,
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Used:        row.Used,
		Limit:       row.LimitValue,
		Remaining:   row.Remaining,
		WindowStart: core.TimeFromPG(row.WindowStart),
		WindowEnd:   core.TimeFromPG(row.WindowEnd),
		RetryAfter:  usDuration(row.RetryAfterUs),
		ResetAfter:  usDuration(row.ResetAfterUs),
		DecidedAt:   core.TimeFromPG(row.DecidedAt),
	}
	if w.Shaped() {
		// As grantLimits reports a grant against one quota.
		res.Limits = []LimitResult{{
			Quota: req.Quota, Window: w, Fits: row.Granted,
			Used: row.Used, Limit: row.LimitValue, Remaining: row.Remaining,
			Burst: row.Burst, Period: time.Duration(row.PeriodUs) * time.Microsecond,
			WindowStart: res.WindowStart, WindowEnd: res.WindowEnd,
			RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter,
		}}
		if !res.Granted {
			res.DeniedBy = req.Quota
		}
	}
	return res, nil
}

// RevokeRequest gives units of a quota back.
type RevokeRequest struct {
	Quota  string
	Member string
	// Amount is the number of units to give back, at least 1. A counter
	// never goes below zero: when it holds fewer units, all are revoked.
	Amount int64
	// Idempotency, when its Key is set, makes the revoke safe to repeat, as
	// for GrantRequest. Its Scope defaults to Quota. To give back the units
	// of one particular grant, use CompensateGrant instead.
	Idempotency IdempotencyKey
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
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// Keyed is the ledger record of a revoke made with an idempotency key.
	Keyed
}

// Revoke gives back up to req.Amount units of the member's counter in the
// current window, never driving it below zero: a compensation for a grant
// whose work failed. It is one SQL statement, also with an idempotency key
// (req.Idempotency), which makes a repeat return the first outcome, as for
// Grant. Serialization failures and deadlocks are retried as for Grant.
//
// Errors: *InputError for a bad quota name, member, amount or idempotency
// key, or a quota of kind rate, fixed or rolling (Revoke serves calendar
// quotas); ErrQuotaNotFound; ErrIdempotencyKeyReused; ErrSchemaMissing;
// database errors; ErrOutcomeUnknown when the statement was sent and no reply said how it
// ended (it may have committed: repeat with the same idempotency key, or
// read the state, to learn the outcome). On any other error nothing was written.
func (c *Client) Revoke(ctx context.Context, req RevokeRequest) (_ RevokeResult, err error) {
	defer c.m.Done(ctx, core.OpRevoke, c.m.Now(), &err)
	return c.revoke(ctx, c.db, req)
}

// RevokeTx is Revoke inside the caller's transaction. Serialization
// failures and deadlocks are returned unchanged, as for GrantTx.
func (c *Client) RevokeTx(ctx context.Context, tx pgx.Tx, req RevokeRequest) (RevokeResult, error) {
	return c.revoke(ctx, tx, req)
}

func (c *Client) revoke(ctx context.Context, x db.DBTX, req RevokeRequest) (RevokeResult, error) {
	key, err := checkRevokeRequest(req)
	if err != nil {
		return RevokeResult{}, err
	}
	if key.Key != "" {
		return c.revokeKeyed(ctx, x, req, key)
	}
	row, err := c.queries.UsageRevoke(ctx, x, db.UsageRevokeParams{
		QuotaName: req.Quota, Member: req.Member, Amount: req.Amount,
	})
	if err != nil {
		return RevokeResult{}, core.DBError("revoke", err)
	}
	if !row.Found {
		return RevokeResult{}, core.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
	}
	if w := Window(row.Kind); w.Shaped() {
		return RevokeResult{}, calendarOnlyError("revoke", req.Quota, w)
	}
	return RevokeResult{
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Revoked:     row.UsedBefore - row.UsedAfter,
		Used:        row.UsedAfter,
		WindowStart: core.TimeFromPG(row.WindowStart),
		WindowEnd:   core.TimeFromPG(row.WindowEnd),
	}, nil
}

// Usage is a member's state under one quota, of any kind, as the database
// clock read it at DBNow: what a grant decided at that instant would report
// (its Used, Limit, Remaining and ResetAfter when it is denied; see
// LimitResult).
type Usage struct {
	Quota  string `json:"quota"`
	Member string `json:"member"`
	// Window is the quota's kind.
	Window Window `json:"window"`
	// Used is the member's counter in the current window (calendar and
	// fixed windows), the units granted in the last Period (rolling), or
	// Burst - Remaining (rate), in units.
	Used int64 `json:"used"`
	// Limit is the limit that applies when a grant names none: the
	// member's own limit, else the quota's default (for a rate, the units
	// per Period). HasLimit is false when neither exists; Remaining is
	// then 0.
	Limit    int64 `json:"limit"`
	HasLimit bool  `json:"has_limit"`
	// Remaining is how many units a grant could take at DBNow: Limit - Used
	// (0 when Used exceeds a since-lowered Limit), or for a rate the units
	// the bucket holds.
	Remaining int64 `json:"remaining"`
	// WindowStart and WindowEnd bound the current window (calendar and
	// fixed windows); zero for WindowNone, rate and rolling.
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// Burst is a rate's burst (0 for the other kinds); Period a rate's
	// period or a fixed or rolling window's length (0 for the calendar
	// windows).
	Burst  int64         `json:"burst"`
	Period time.Duration `json:"-"`
	// ResetAfter is how long after DBNow the member is back at its full limit
	// with no grant meanwhile, as GrantResult.ResetAfter: the window's end
	// (Never for WindowNone), when a rate's bucket is full again, when the
	// newest grant of a rolling window leaves it. RefillAfter is how long
	// until Remaining next grows: 0 when nothing is in use, the window's
	// end for a counter (Never for WindowNone), when the oldest grant of a
	// rolling window leaves it, when a rate emits its next unit (Never for
	// a rate of limit 0).
	// Both are rounded up to whole microseconds.
	ResetAfter  time.Duration `json:"-"`
	RefillAfter time.Duration `json:"-"`
	// DBNow is the database clock's instant of the read.
	DBNow time.Time `json:"db_now"`
}

// Usage reads a member's state under a quota of any kind, writing nothing
// and taking no lock: one statement, pgquota.limit_usage
// (migrations/00017_limit_usage.sql), with the formulas of the grant path
// (pgquota.grant_limits). A grant not yet committed is not seen.
//
// Errors: *InputError for a bad quota name or member; ErrQuotaNotFound;
// ErrSchemaMissing; database errors.
func (c *Client) Usage(ctx context.Context, quota, member string) (Usage, error) {
	if err := core.CheckName("quota name", quota); err != nil {
		return Usage{}, err
	}
	if err := core.CheckName("member", member); err != nil {
		return Usage{}, err
	}
	row, err := c.queries.UsageGet(ctx, c.db.Reads(), db.UsageGetParams{QuotaName: quota, Member: member})
	if isNoRows(err) {
		return Usage{}, core.Errorf("%w: %q", ErrQuotaNotFound, quota)
	}
	if err != nil {
		return Usage{}, core.DBError("usage", err)
	}
	return Usage{
		Quota:       quota,
		Member:      member,
		Window:      Window(row.Kind),
		Used:        row.Used,
		Limit:       row.LimitValue,
		HasLimit:    row.HasLimit,
		Remaining:   row.Remaining,
		WindowStart: core.TimeFromPG(row.WindowStart),
		WindowEnd:   core.TimeFromPG(row.WindowEnd),
		Burst:       row.Burst,
		Period:      time.Duration(row.PeriodUs) * time.Microsecond,
		ResetAfter:  usDuration(row.ResetAfterUs),
		RefillAfter: usDuration(row.RefillAfterUs),
		DBNow:       core.TimeFromPG(row.ReadAt),
	}, nil
}
