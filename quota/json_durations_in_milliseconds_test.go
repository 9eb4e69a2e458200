package quota_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// The library's results encode durations as the pgquota command's --json
// does: whole milliseconds under a key ending in _ms, a wait rounded up
// and Never as -1, a length rounded down; decoding gives them back to the
// millisecond.
func TestResultsEncodeDurationsInMilliseconds(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC)
	for _, tc := range []struct {
		name  string
		v     any
		back  any
		keys  map[string]float64
		gone  []string
		equal any
	}{
		{
			name: "grant",
			v: quota.GrantResult{Quota: "api", Member: "m", Granted: false, RetryAfter: 1500*time.Millisecond + 200*time.Microsecond,
				ResetAfter: quota.Never, DecidedAt: at,
				Limits: []quota.LimitResult{{Quota: "api", Period: 90*time.Second + 999*time.Microsecond, RetryAfter: time.Microsecond, ResetAfter: 0}}},
			back: &quota.GrantResult{},
			keys: map[string]float64{"retry_after_ms": 1501, "reset_after_ms": -1},
			gone: []string{"retry_after", "reset_after"},
			equal: &quota.GrantResult{Quota: "api", Member: "m", RetryAfter: 1501 * time.Millisecond, ResetAfter: quota.Never, DecidedAt: at,
				Limits: []quota.LimitResult{{Quota: "api", Period: 90 * time.Second, RetryAfter: time.Millisecond, ResetAfter: 0}}},
		},
		{
			name:  "usage",
			v:     quota.Usage{Quota: "r", Period: time.Minute, ResetAfter: 2 * time.Second, RefillAfter: quota.Never, DBNow: at},
			back:  &quota.Usage{},
			keys:  map[string]float64{"period_ms": 60000, "reset_after_ms": 2000, "refill_after_ms": -1},
			gone:  []string{"period", "reset_after", "refill_after"},
			equal: &quota.Usage{Quota: "r", Period: time.Minute, ResetAfter: 2 * time.Second, RefillAfter: quota.Never, DBNow: at},
		},
		{
			name:  "outbox status",
			v:     outbox.Status{Pending: 2, Lag: 2500*time.Millisecond + 700*time.Microsecond, DBNow: at},
			back:  &outbox.Status{},
			keys:  map[string]float64{"lag_ms": 2500, "pending": 2},
			gone:  []string{"lag_ns", "lag"},
			equal: &outbox.Status{Pending: 2, Lag: 2500 * time.Millisecond, DBNow: at},
		},
		{
			name:  "quota",
			v:     quota.Quota{Name: "r", Window: quota.WindowRate, Period: 1500 * time.Microsecond, Burst: 3},
			back:  &quota.Quota{},
			keys:  map[string]float64{"period_ms": 1},
			gone:  []string{"period"},
			equal: &quota.Quota{Name: "r", Window: quota.WindowRate, Period: time.Millisecond, Burst: 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			require.NoError(t, err)
			var m map[string]any
			require.NoError(t, json.Unmarshal(b, &m))
			for k, want := range tc.keys {
				require.Equal(t, want, m[k], "%s in %s", k, b)
			}
			for _, k := range tc.gone {
				require.NotContains(t, m, k, "no nanosecond key %s in %s", k, b)
			}
			require.NoError(t, json.Unmarshal(b, tc.back))
			require.Equal(t, tc.equal, tc.back)
		})
	}
	b, err := json.Marshal(quota.GrantResult{Limits: []quota.LimitResult{{Period: time.Second}}})
	require.NoError(t, err)
	require.Contains(t, string(b), `"limits":[{`)
	require.Contains(t, string(b), `"period_ms":1000`, "a grant's limits encode as LimitResult does")
}
