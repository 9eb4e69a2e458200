package quota

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Never is the RetryAfter (or ResetAfter) of a state that no wait changes:
// an amount above a quota's limit or burst, a limit of 0, a lifetime
// (WindowNone) counter that is full.
const Never time.Duration = -1

// MaxQuotasPerGrant is the most quotas one grant may name (GrantRequest.Quotas).
const MaxQuotasPerGrant = 16

// LimitResult is the outcome of one quota of a grant decided by
// pgquota.grant_limits: a quota of kind rate, fixed or rolling, or any quota
// of a grant against several (GrantRequest.Quotas).
type LimitResult struct {
	Quota  string `json:"quota"`
	Window Window `json:"window"`
	// Fits reports whether this quota had room for the amount. The grant
	// moved every quota's state, or none: GrantResult.Granted.
	Fits bool `json:"fits"`
	// Used, Limit and Remaining after the call, in units. For a counter
	// (calendar or fixed window) Used is the counter and Limit the
	// limit; for a rolling window, Used is the units granted in the last
	// Period. For a rate, Limit is the units per Period, Burst the most
	// at once, Remaining the units grantable at DecidedAt, and Used is
	// Burst - Remaining.
	Used      int64 `json:"used"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// Burst is a rate's burst (0 for the other kinds).
	Burst int64 `json:"burst"`
	// Period is a rate's period or a fixed or rolling window's length; 0
	// for the calendar windows.
	Period time.Duration `json:"-"`
	// WindowStart and WindowEnd bound the counter's window (calendar and
	// fixed windows; zero for the others and for WindowNone).
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// RetryAfter is how long after DecidedAt this quota has room for the
	// same amount (0 when it has, Never when it never will). ResetAfter is
	// how long until it is back at its full limit (Never for a lifetime
	// counter, or a rate of limit 0).
	RetryAfter time.Duration `json:"-"`
	ResetAfter time.Duration `json:"-"`
}

// quotaNames returns the quotas a request checked by checkGrantRequest
// names: req.Quotas, or req.Quota alone.
func quotaNames(req GrantRequest) []string {
	if len(req.Quotas) > 0 {
		return req.Quotas
	}
	return []string{req.Quota}
}

// shapedRoute reports whether req is decided by pgquota.grant_limits: a
// grant against several quotas, or one of kind rate, fixed or rolling. The
// group commit and the coalescer need it (they serve calendar quotas); the
// plain path does not (pgquota.grant serves every kind). The kind of a
// quota this client has not seen is read once (QuotaKindGet); when that
// read fails, the calendar path runs and reports its own error. A keyed
// request, which grant_limits refuses, re-reads a cached shaped kind first.
func (c *Client) shapedRoute(ctx context.Context, x db.DBTX, req GrantRequest) bool {
	shaped, _ := c.shapedRouteErr(ctx, x, req)
	return shaped
}

// shapedRouteErr is shapedRoute that also returns the error of the kind's
// read, other than ErrQuotaNotFound (the calendar path reports that one).
// In a transaction (a keyed GrantBatch, GrantBatchTx) a failed read has
// aborted it, so the caller returns that error: every later statement
// would only fail with 25P02 and hide it.
func (c *Client) shapedRouteErr(ctx context.Context, x db.DBTX, req GrantRequest) (bool, error) {
	if len(req.Quotas) > 0 {
		return true, nil
	}
	if core.CheckName("quota name", req.Quota) != nil {
		// Not a check (checkGrantRequest reports the name): a name the
		// database cannot hold is not looked up.
		return false, nil
	}
	if w, ok := c.kinds.Load(req.Quota); ok && w.Shaped() && req.Idempotency.Key != "" {
		// grantLimits refuses a key: before refusing on a cached kind,
		// read it again (another client may have redefined the quota as
		// a calendar window, which records keyed grants).
		c.kinds.Delete(req.Quota)
	}
	w, err := c.quotaKind(ctx, x, req.Quota)
	if errors.Is(err, ErrQuotaNotFound) {
		return false, nil
	}
	return err == nil && w.Shaped(), err
}

// grantLimits grants req through pgquota.grant_limits (one statement).
// On the client's pool (pgquota owns the statement's implicit transaction)
// a serialization failure or deadlock is retried, as for a calendar grant
// (retry); in the caller's transaction it is returned unchanged.
func (c *Client) grantLimits(ctx context.Context, x db.DBTX, req GrantRequest) (GrantResult, error) {
	if p, ok := x.(core.RetryPool); ok {
		return core.Retry(ctx, c.policy, func() (GrantResult, error) { return c.grantLimitsOnce(ctx, p.Pool, req) })
	}
	return c.grantLimitsOnce(ctx, x, req)
}

// grantLimitsOnce runs the statement for req, validated by its caller
// (checkGrantRequest).
func (c *Client) grantLimitsOnce(ctx context.Context, x db.DBTX, req GrantRequest) (GrantResult, error) {
	names := quotaNames(req)
	var limit pgtype.Int8
	if req.Limit != nil {
		limit = pgtype.Int8{Int64: *req.Limit, Valid: true}
	}
	rows, err := c.queries.LimitsGrant(ctx, x, db.LimitsGrantParams{
		QuotaNames: names, Member: req.Member, Amount: req.Amount, LimitValue: limit,
	})
	if err != nil {
		return GrantResult{}, core.DBError("grant", err)
	}
	return c.limitsOutcome(req, names, rows)
}

// limitsOutcome is the GrantResult of req from the rows pgquota.grant_limits
// returned for it (one per quota of names, in order), or the request's error
// (ErrQuotaNotFound, ErrNoLimit, *InputError). It learns each quota's kind.
// Grant and the batch statement (batch_limits.go) share it.
func (c *Client) limitsOutcome(req GrantRequest, names []string, rows []db.LimitsGrantRow) (GrantResult, error) {
	if len(rows) != len(names) {
		return GrantResult{}, core.Errorf("pgquota: grant: %d rows for %d quotas", len(rows), len(names))
	}
	for _, r := range rows {
		if !r.Found {
			c.kinds.Delete(r.QuotaName)
			return GrantResult{}, core.Errorf("%w: %q", ErrQuotaNotFound, r.QuotaName)
		}
		c.kinds.Store(r.QuotaName, Window(r.Kind))
	}
	for _, r := range rows {
		switch {
		case r.Decided:
		case !r.HasLimit:
			return GrantResult{}, core.Errorf("%w (quota %q, member %q)", ErrNoLimit, r.QuotaName, req.Member)
		case Window(r.Kind) == WindowRolling && r.LimitValue > MaxRollingLimit:
			return GrantResult{}, core.Invalid("limit", "of rolling quota %q for member %q is %d, at most %d is supported", r.QuotaName, req.Member, r.LimitValue, MaxRollingLimit)
		case r.PeriodUs == 0 && Window(r.Kind).Shaped():
			return GrantResult{}, core.Errorf("pgquota: grant: quota %q of kind %s has no shape row", r.QuotaName, r.Kind)
		}
	}
	res := GrantResult{
		Member:    req.Member,
		Amount:    req.Amount,
		Granted:   rows[0].Granted,
		DecidedAt: core.TimeFromPG(rows[0].DecidedAt),
		Limits:    make([]LimitResult, len(rows)),
	}
	bind := -1 // the binding limit: the refusing one with the longest wait, else the one with the least room
	for i, r := range rows {
		l := LimitResult{
			Quota:       r.QuotaName,
			Window:      Window(r.Kind),
			Fits:        r.Fits,
			Used:        r.Used,
			Limit:       r.LimitValue,
			Remaining:   r.Remaining,
			Burst:       r.Burst,
			Period:      time.Duration(r.PeriodUs) * time.Microsecond,
			WindowStart: core.TimeFromPG(r.WindowStart),
			WindowEnd:   core.TimeFromPG(r.WindowEnd),
			RetryAfter:  usDuration(r.RetryAfterUs),
			ResetAfter:  usDuration(r.ResetAfterUs),
		}
		res.Limits[i] = l
		if bind < 0 {
			bind = i
			continue
		}
		b := res.Limits[bind]
		switch {
		case !l.Fits && b.Fits:
			bind = i
		case !l.Fits && !b.Fits && b.RetryAfter != Never && (l.RetryAfter == Never || l.RetryAfter > b.RetryAfter):
			bind = i
		case l.Fits && b.Fits && l.Remaining < b.Remaining:
			bind = i
		}
	}
	b := res.Limits[bind]
	res.Quota = b.Quota
	res.Used, res.Limit, res.Remaining = b.Used, b.Limit, b.Remaining
	res.WindowStart, res.WindowEnd = b.WindowStart, b.WindowEnd
	res.RetryAfter = b.RetryAfter
	if !res.Granted {
		res.DeniedBy = b.Quota
	}
	// The state is full again when every quota is.
	for _, l := range res.Limits {
		if l.ResetAfter == Never || res.ResetAfter == Never {
			res.ResetAfter = Never
		} else {
			res.ResetAfter = max(res.ResetAfter, l.ResetAfter)
		}
	}
	return res, nil
}

// usDuration converts a wait in microseconds (-1 for Never) to a Duration,
// saturating at math.MaxInt64 (~292 years) instead of wrapping: a rate's
// wait can be up to burst x period (the SQL clamps it to bigint).
func usDuration(us int64) time.Duration {
	if us < 0 {
		return Never
	}
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}
