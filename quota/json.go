package quota

import (
	"encoding/json"
	"math"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// The results that hold durations (GrantResult, LimitResult, Usage, Quota)
// encode each in JSON as whole milliseconds under a key ending in _ms, the
// names and units the pgquota command's --json prints (docs/json-output.md):
// a wait (retry_after_ms, reset_after_ms, refill_after_ms) is rounded up,
// so that a client sleeping it never retries early, and Never is -1; a
// length (period_ms) is rounded down. Decoding reverses it, to the
// millisecond. Every other field keeps its Go type's encoding (times in
// RFC 3339 with the database's microseconds).

// waitMS is core.WaitMS's inverse: -1 (or any negative value) is Never.
func waitMS(ms int64) time.Duration {
	if ms < 0 {
		return Never
	}
	return msDuration(ms)
}

// msDuration is ms milliseconds, saturated at the longest time.Duration
// (a saturated wait, math.MaxInt64 nanoseconds, encodes as
// 9223372036855 ms and must not come back negative).
func msDuration(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

type grantResultJSON GrantResult

type grantResultWire struct {
	grantResultJSON
	RetryAfterMS int64 `json:"retry_after_ms"`
	ResetAfterMS int64 `json:"reset_after_ms"`
}

// MarshalJSON encodes r with its waits in whole milliseconds
// (retry_after_ms, reset_after_ms), rounded up so that a client sleeping
// one never retries early, Never as -1: the keys and units the pgquota
// command's --json prints (docs/json-output.md). Every other field keeps
// its Go type's encoding.
func (r GrantResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(grantResultWire{grantResultJSON(r), core.WaitMS(r.RetryAfter), core.WaitMS(r.ResetAfter)})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (r *GrantResult) UnmarshalJSON(b []byte) error {
	var w grantResultWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = GrantResult(w.grantResultJSON)
	r.RetryAfter, r.ResetAfter = waitMS(w.RetryAfterMS), waitMS(w.ResetAfterMS)
	return nil
}

type limitResultJSON LimitResult

type limitResultWire struct {
	limitResultJSON
	PeriodMS     int64 `json:"period_ms"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	ResetAfterMS int64 `json:"reset_after_ms"`
}

// MarshalJSON encodes l with its period and waits in milliseconds
// (period_ms, retry_after_ms, reset_after_ms).
func (l LimitResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(limitResultWire{limitResultJSON(l), l.Period.Milliseconds(), core.WaitMS(l.RetryAfter), core.WaitMS(l.ResetAfter)})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (l *LimitResult) UnmarshalJSON(b []byte) error {
	var w limitResultWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*l = LimitResult(w.limitResultJSON)
	l.Period = msDuration(w.PeriodMS)
	l.RetryAfter, l.ResetAfter = waitMS(w.RetryAfterMS), waitMS(w.ResetAfterMS)
	return nil
}

type usageJSON Usage

type usageWire struct {
	usageJSON
	PeriodMS      int64 `json:"period_ms"`
	ResetAfterMS  int64 `json:"reset_after_ms"`
	RefillAfterMS int64 `json:"refill_after_ms"`
}

// MarshalJSON encodes u with its period and waits in milliseconds
// (period_ms, reset_after_ms, refill_after_ms).
func (u Usage) MarshalJSON() ([]byte, error) {
	return json.Marshal(usageWire{usageJSON(u), u.Period.Milliseconds(), core.WaitMS(u.ResetAfter), core.WaitMS(u.RefillAfter)})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (u *Usage) UnmarshalJSON(b []byte) error {
	var w usageWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*u = Usage(w.usageJSON)
	u.Period = msDuration(w.PeriodMS)
	u.ResetAfter, u.RefillAfter = waitMS(w.ResetAfterMS), waitMS(w.RefillAfterMS)
	return nil
}

type quotaJSON Quota

type quotaWire struct {
	quotaJSON
	PeriodMS int64 `json:"period_ms"`
}

// MarshalJSON encodes q with its period in milliseconds (period_ms).
func (q Quota) MarshalJSON() ([]byte, error) {
	return json.Marshal(quotaWire{quotaJSON(q), q.Period.Milliseconds()})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (q *Quota) UnmarshalJSON(b []byte) error {
	var w quotaWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*q = Quota(w.quotaJSON)
	q.Period = msDuration(w.PeriodMS)
	return nil
}
