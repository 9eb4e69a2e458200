package quota

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// The kinds of quota beside the calendar windows (migrations/00011). Each
// needs Definition.Period; grants of these kinds, and grants against
// several quotas (GrantRequest.Quotas), are one call of the SQL function
// pgquota.grant_limits: one statement, one round trip, decided on locked
// rows with the database clock read after the locks.
const (
	// WindowRate is a rate with a burst: DefaultLimit units per Period, at
	// most Burst at once, decided by the generic cell rate algorithm (GCRA,
	// the ATM Forum's, equivalent to a token bucket; the form of
	// go-redis/redis_rate): with emission interval T = Period/limit, a grant
	// of n units at instant t fits iff max(TAT, t) + n*T - Burst*T <= t, and
	// then the theoretical arrival time TAT becomes max(TAT, t) + n*T. It is
	// computed exactly, in units of 1/limit microsecond (where T is the
	// period, a whole number), so 1/3 s intervals do not drift and at an
	// exact refill instant (6/s: the 6 units taken at t0 are back at
	// exactly t0 + 1 s) the decision, Remaining and the waits agree
	// (migrations/00020_decision_instant.sql).
	WindowRate Window = "rate"
	// WindowFixed is a fixed window of any length: a counter per window
	// [Origin + k*Period, Origin + (k+1)*Period), like the calendar windows
	// (and with their edge: a member can spend its limit at the end of one
	// window and again at the start of the next). Every grant is decided at
	// an instant its window holds (WindowStart <= DecidedAt < WindowEnd) and
	// counted in that window, also when a boundary passes during the call.
	WindowFixed Window = "fixed"
	// WindowRolling is "at most DefaultLimit units in any period of length
	// Period", exactly: for every half-open interval [s, s+Period), the
	// units of the grants decided in it (by the database clock's instant of
	// each decision, GrantResult.DecidedAt) sum to at most the limit. Each
	// member's row keeps the grants of the last Period (instant and units),
	// at most limit entries, so the limit is at most MaxRollingLimit.
	WindowRolling Window = "rolling"
)

// MaxRollingLimit is the largest limit of a WindowRolling quota (its
// default, a member's override or a call's limit): the state row of a
// member holds up to this many grants (16 bytes each).
const MaxRollingLimit = 10000

// Shaped reports whether w is one of WindowRate, WindowFixed, WindowRolling.
func (w Window) Shaped() bool { return w == WindowRate || w == WindowFixed || w == WindowRolling }

// Bounds of Definition.Period.
const (
	minPeriod = time.Millisecond
	maxPeriod = 100 * 365 * 24 * time.Hour // pgquota.quota_shape's CHECK: 3155760000000000 us is 36525 days
)

func (c *Client) defineShaped(ctx context.Context, x db.DBTX, d Definition) (Quota, error) {
	if err := core.CheckName("quota name", d.Name); err != nil {
		return Quota{}, err
	}
	if d.TimeZone != "" && d.TimeZone != "UTC" {
		return Quota{}, core.Invalid("time zone", "applies to calendar windows only, not to window %q", d.Window)
	}
	switch {
	case d.Period == 0:
		return Quota{}, core.Invalid("period", "is required for window %q (the rate's period or the window's length)", d.Window)
	case d.Period < minPeriod:
		return Quota{}, core.Invalid("period", "must be at least %s, got %s", minPeriod, d.Period)
	case d.Period > 36525*24*time.Hour:
		return Quota{}, core.Invalid("period", "must be at most 36525 days, got %s", d.Period)
	case d.Period%time.Millisecond != 0:
		return Quota{}, core.Invalid("period", "must be a whole number of milliseconds, got %s", d.Period)
	}
	var def pgtype.Int8
	if d.DefaultLimit != nil {
		if err := core.CheckUnits("default limit", *d.DefaultLimit, 0); err != nil {
			return Quota{}, err
		}
		if d.Window == WindowRate && *d.DefaultLimit == 0 {
			return Quota{}, core.Invalid("rate", "must be at least 1 unit per period, got 0")
		}
		if d.Window == WindowRolling && *d.DefaultLimit > MaxRollingLimit {
			return Quota{}, core.Invalid("default limit", "of a rolling window must be at most %d, got %d", MaxRollingLimit, *d.DefaultLimit)
		}
		def = pgtype.Int8{Int64: *d.DefaultLimit, Valid: true}
	}
	var burst pgtype.Int8
	if d.Burst != 0 {
		if d.Window != WindowRate {
			return Quota{}, core.Invalid("burst", "applies to window %q only, not to %q", WindowRate, d.Window)
		}
		if err := core.CheckUnits("burst", d.Burst, 1); err != nil {
			return Quota{}, err
		}
		burst = pgtype.Int8{Int64: d.Burst, Valid: true}
	}
	origin := time.Unix(0, 0).UTC()
	if !d.Origin.IsZero() {
		if d.Window != WindowFixed {
			return Quota{}, core.Invalid("origin", "applies to window %q only, not to %q", WindowFixed, d.Window)
		}
		if d.Origin.Year() < 1 || d.Origin.Year() > 9999 {
			return Quota{}, core.Invalid("origin", "must be between the years 1 and 9999, got %s", d.Origin)
		}
		if d.Origin.Nanosecond()%int(time.Millisecond) != 0 {
			return Quota{}, core.Invalid("origin", "must be a whole number of milliseconds (windows are cut in milliseconds), got %s", d.Origin.Format(time.RFC3339Nano))
		}
		origin = d.Origin
	}
	row, err := c.queries.QuotaShapeDefine(ctx, x, db.QuotaShapeDefineParams{
		Name:         d.Name,
		WindowUnit:   string(d.Window),
		DefaultLimit: def,
		PeriodUs:     d.Period.Microseconds(),
		Burst:        burst,
		Origin:       pgtype.Timestamptz{Time: origin, Valid: true},
		ReplaceKind:  d.ReplaceKind,
	})
	if isNoRows(err) {
		if kerr := c.kindChangeError(ctx, x, d); kerr != nil {
			return Quota{}, kerr
		}
	}
	if err != nil {
		return Quota{}, core.DBError("define quota", err)
	}
	c.kinds.Store(d.Name, d.Window)
	q := quotaFromRow(db.QuotaRow{
		Name: row.Name, WindowUnit: row.WindowUnit, TimeZone: row.TimeZone,
		DefaultLimit: row.DefaultLimit, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt,
	})
	applyShape(&q, db.PgquotaQuotaShape{QuotaName: row.Name, PeriodUs: row.PeriodUs, Burst: row.Burst, Origin: row.Origin})
	return q, nil
}

// applyShape fills a quota's shape fields from its quota_shape row.
func applyShape(q *Quota, s db.PgquotaQuotaShape) {
	q.Period = time.Duration(s.PeriodUs) * time.Microsecond
	switch q.Window {
	case WindowRate:
		q.Burst = s.Burst.Int64
		if !s.Burst.Valid && q.DefaultLimit != nil {
			q.Burst = *q.DefaultLimit
		}
	case WindowFixed:
		q.Origin = core.TimeFromPG(s.Origin).UTC()
	}
}

// withShape reads the shape of a quota of a shaped kind.
func (c *Client) withShape(ctx context.Context, q Quota) (Quota, error) {
	if !q.Window.Shaped() {
		return q, nil
	}
	s, err := c.queries.QuotaShapeGet(ctx, c.db.Reads(), q.Name)
	if isNoRows(err) {
		return Quota{}, core.Errorf("%w: %q", ErrQuotaNotFound, q.Name)
	}
	if err != nil {
		return Quota{}, core.DBError("get quota", err)
	}
	applyShape(&q, s)
	return q, nil
}

// withShapes reads the shapes of the quotas of shaped kinds in qs.
func (c *Client) withShapes(ctx context.Context, qs []Quota) ([]Quota, error) {
	any := false
	for _, q := range qs {
		any = any || q.Window.Shaped()
	}
	if !any {
		return qs, nil
	}
	rows, err := core.Retry(ctx, c.policy, func() ([]db.PgquotaQuotaShape, error) { return c.queries.QuotaShapeList(ctx, c.pool) })
	if err != nil {
		return nil, core.DBError("list quotas", err)
	}
	byName := make(map[string]db.PgquotaQuotaShape, len(rows))
	for _, r := range rows {
		byName[r.QuotaName] = r
	}
	for i := range qs {
		if s, ok := byName[qs[i].Name]; ok && qs[i].Window.Shaped() {
			applyShape(&qs[i], s)
		}
	}
	return qs, nil
}

// kindCache remembers, per quota name, its kind (Window), so that the
// group commit and the coalescer (which serve calendar quotas) and
// GrantBatch pick their path without asking the database first; the others
// go to pgquota.grant_limits. A name is looked up once (QuotaKindGet); a
// kind changed by another client is learnt from the next grant
// (pgquota.grant, pgquota.grant_keyed and grant_limits report the kind).
type kindCache struct{ m sync.Map }

func (k *kindCache) Load(name string) (Window, bool) {
	v, ok := k.m.Load(name)
	if !ok {
		return "", false
	}
	return v.(Window), true
}

func (k *kindCache) Store(name string, w Window) { k.m.Store(name, w) }
func (k *kindCache) Delete(name string)          { k.m.Delete(name) }

// quotaKind returns the kind of quota name, from the cache or the database.
func (c *Client) quotaKind(ctx context.Context, x db.DBTX, name string) (Window, error) {
	if w, ok := c.kinds.Load(name); ok {
		return w, nil
	}
	unit, err := c.queries.QuotaKindGet(ctx, x, name)
	if isNoRows(err) {
		return "", core.Errorf("%w: %q", ErrQuotaNotFound, name)
	}
	if err != nil {
		return "", core.DBError("grant", err)
	}
	w := Window(unit)
	c.kinds.Store(name, w)
	return w, nil
}
