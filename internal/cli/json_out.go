package cli

import (
	"time"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// What --json prints for the library's results that hold durations or
// names that differ between commands. The library's own JSON tags stay as
// they are (time.Duration in nanoseconds, for Go callers); the CLI prints
// every duration as whole milliseconds under a key ending in _ms, and one
// name per concept (docs/json-output.md).

// msWait is a wait in whole milliseconds, rounded up, so that a script
// sleeping it never retries early; quota.Never (no wait helps) is -1.
func msWait(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// msLeft is time left (a lease's remaining TTL) in whole milliseconds,
// rounded down, so that a script never counts on more than is left.
func msLeft(d time.Duration) int64 { return max(d, 0).Milliseconds() }

// limitJSON is quota.LimitResult for --json.
type limitJSON struct {
	Quota        string       `json:"quota"`
	Window       quota.Window `json:"window"`
	Fits         bool         `json:"fits"`
	Used         int64        `json:"used"`
	Limit        int64        `json:"limit"`
	Remaining    int64        `json:"remaining"`
	Burst        int64        `json:"burst"`
	PeriodMS     int64        `json:"period_ms"`
	WindowStart  time.Time    `json:"window_start"`
	WindowEnd    time.Time    `json:"window_end"`
	RetryAfterMS int64        `json:"retry_after_ms"`
	ResetAfterMS int64        `json:"reset_after_ms"`
}

// grantJSON is quota.GrantResult for --json.
type grantJSON struct {
	Granted     bool      `json:"granted"`
	Quota       string    `json:"quota"`
	Member      string    `json:"member"`
	Amount      int64     `json:"amount"`
	Used        int64     `json:"used"`
	Limit       int64     `json:"limit"`
	Remaining   int64     `json:"remaining"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	quota.Keyed
	RetryAfterMS int64       `json:"retry_after_ms"`
	ResetAfterMS int64       `json:"reset_after_ms"`
	DecidedAt    time.Time   `json:"decided_at"`
	DeniedBy     string      `json:"denied_by"`
	Limits       []limitJSON `json:"limits"`
}

func grantOut(r quota.GrantResult) grantJSON {
	out := grantJSON{
		Granted: r.Granted, Quota: r.Quota, Member: r.Member, Amount: r.Amount,
		Used: r.Used, Limit: r.Limit, Remaining: r.Remaining,
		WindowStart: r.WindowStart, WindowEnd: r.WindowEnd, Keyed: r.Keyed,
		RetryAfterMS: msWait(r.RetryAfter), ResetAfterMS: msWait(r.ResetAfter),
		DecidedAt: r.DecidedAt, DeniedBy: r.DeniedBy,
	}
	if r.Limits != nil {
		out.Limits = make([]limitJSON, len(r.Limits))
	}
	for i, l := range r.Limits {
		out.Limits[i] = limitJSON{
			Quota: l.Quota, Window: l.Window, Fits: l.Fits,
			Used: l.Used, Limit: l.Limit, Remaining: l.Remaining, Burst: l.Burst,
			PeriodMS: l.Period.Milliseconds(), WindowStart: l.WindowStart, WindowEnd: l.WindowEnd,
			RetryAfterMS: msWait(l.RetryAfter), ResetAfterMS: msWait(l.ResetAfter),
		}
	}
	return out
}

// usageJSON is quota.Usage for --json.
type usageJSON struct {
	Quota         string       `json:"quota"`
	Member        string       `json:"member"`
	Window        quota.Window `json:"window"`
	Used          int64        `json:"used"`
	Limit         int64        `json:"limit"`
	HasLimit      bool         `json:"has_limit"`
	Remaining     int64        `json:"remaining"`
	WindowStart   time.Time    `json:"window_start"`
	WindowEnd     time.Time    `json:"window_end"`
	Burst         int64        `json:"burst"`
	PeriodMS      int64        `json:"period_ms"`
	ResetAfterMS  int64        `json:"reset_after_ms"`
	RefillAfterMS int64        `json:"refill_after_ms"`
	DBNow         time.Time    `json:"db_now"`
}

func usageOut(u quota.Usage) usageJSON {
	return usageJSON{
		Quota: u.Quota, Member: u.Member, Window: u.Window, Used: u.Used,
		Limit: u.Limit, HasLimit: u.HasLimit, Remaining: u.Remaining,
		WindowStart: u.WindowStart, WindowEnd: u.WindowEnd, Burst: u.Burst,
		PeriodMS: u.Period.Milliseconds(), ResetAfterMS: msWait(u.ResetAfter),
		RefillAfterMS: msWait(u.RefillAfter), DBNow: u.DBNow,
	}
}

// quotaJSON is quota.Quota for --json.
type quotaJSON struct {
	Name         string       `json:"quota"`
	Window       quota.Window `json:"window"`
	TimeZone     string       `json:"time_zone"`
	DefaultLimit *int64       `json:"default_limit"`
	PeriodMS     int64        `json:"period_ms"`
	Burst        int64        `json:"burst"`
	Origin       time.Time    `json:"origin"`
	CreatedAt    time.Time    `json:"created_at"`
	UpdatedAt    time.Time    `json:"updated_at"`
}

func quotaOut(q quota.Quota) quotaJSON {
	return quotaJSON{
		Name: q.Name, Window: q.Window, TimeZone: q.TimeZone, DefaultLimit: q.DefaultLimit,
		PeriodMS: q.Period.Milliseconds(), Burst: q.Burst, Origin: q.Origin,
		CreatedAt: q.CreatedAt, UpdatedAt: q.UpdatedAt,
	}
}

// leaseJSON is lease.Lease for --json, with the time it has left.
type leaseJSON struct {
	lease.Lease
	RemainingMS int64 `json:"remaining_ms"`
}

func leaseOut(l lease.Lease) leaseJSON {
	return leaseJSON{Lease: l, RemainingMS: msLeft(l.Remaining())}
}

// slotJSON is lease.Slot for --json: "semaphore" names the semaphore (as
// in slot show and a full semaphore's denial), "lease" the slot's lease
// (slot:NAME:INDEX), "held" whether this slot is held; "holders" (in
// printSlot and slot show) counts the semaphore's held slots.
type slotJSON struct {
	Semaphore   string    `json:"semaphore"`
	Index       int       `json:"slot"`
	Lease       string    `json:"lease"`
	Holder      string    `json:"holder"`
	Attempt     string    `json:"attempt"`
	Token       int64     `json:"token"`
	AcquiredAt  time.Time `json:"acquired_at"`
	RenewedAt   time.Time `json:"renewed_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	DBNow       time.Time `json:"db_now"`
	Held        bool      `json:"held"`
	Payload     string    `json:"payload"`
	RemainingMS int64     `json:"remaining_ms"`
}

func slotOut(s lease.Slot) slotJSON {
	return slotJSON{
		Semaphore: s.Semaphore, Index: s.Index, Lease: s.Name, Holder: s.Holder, Attempt: s.Attempt,
		Token: s.Token, AcquiredAt: s.AcquiredAt, RenewedAt: s.RenewedAt, ExpiresAt: s.ExpiresAt,
		DBNow: s.DBNow, Held: s.Held, Payload: s.Payload, RemainingMS: msLeft(s.Remaining()),
	}
}
