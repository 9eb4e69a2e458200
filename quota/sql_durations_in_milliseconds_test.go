package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// The public SQL functions (pgquota.grant, grant_keyed, grant_limits,
// limit_usage; docs/sql.md) give every duration in milliseconds, as the
// Go library's JSON and the CLI do: each _ms column is the library's
// microsecond figure for the same decision rounded up to the next
// millisecond (waiting retry_after_ms is always enough), with 0 and -1
// (no wait helps, never) kept. The clock is fixed, so the public function
// and the library's row function decide at the same instant.
func TestSQLFunctionsReturnDurationsInMilliseconds(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.define(t, quota.Definition{Name: "fixed10s", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: 10 * time.Second})
	b.define(t, quota.Definition{Name: "rate3", Window: quota.WindowRate, DefaultLimit: ptr(int64(3)), Period: time.Second})
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr(int64(1))})
	b.setClock(t, "2026-03-01T12:00:00.0004Z")
	for _, q := range []string{"fixed10s", "rate3", "rate3", "rate3", "day"} {
		var granted bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT granted FROM pgquota.grant($1, 'm', 1)`, q).Scan(&granted))
		require.True(t, granted, "the unit of %s", q)
	}

	cases := []struct {
		name   string
		public string // three durations in milliseconds
		row    string // the same three in microseconds
		want   [3]int64
	}{
		{"grant, fixed window denied", `SELECT retry_after_ms, reset_after_ms, period_ms FROM pgquota.grant('fixed10s', 'm', 1)`,
			`SELECT retry_after_us, reset_after_us, period_us FROM pgquota.grant_row('fixed10s', 'm', 1, NULL)`,
			[3]int64{10_000, 10_000, 10_000}},
		{"grant, rate denied", `SELECT retry_after_ms, reset_after_ms, period_ms FROM pgquota.grant('rate3', 'm', 1)`,
			`SELECT retry_after_us, reset_after_us, period_us FROM pgquota.grant_row('rate3', 'm', 1, NULL)`,
			[3]int64{334, 1_000, 1_000}},
		{"grant, above the limit: no wait helps", `SELECT retry_after_ms, 0, 0 FROM pgquota.grant('rate3', 'm', 4)`,
			`SELECT retry_after_us, 0, 0 FROM pgquota.grant_row('rate3', 'm', 4, NULL)`,
			[3]int64{-1, 0, 0}},
		{"grant_keyed, day denied", `SELECT retry_after_ms, reset_after_ms, 0 FROM pgquota.grant_keyed('s', 'k1', 'day', 'm', 1)`,
			`SELECT retry_after_us, reset_after_us, 0 FROM pgquota.grant_keyed_row('s', 'k2', 'day', 'm', 1, NULL)`,
			[3]int64{43_200_000, 43_200_000, 0}},
		{"grant_limits, rate denied", `SELECT retry_after_ms, reset_after_ms, period_ms FROM pgquota.grant_limits(ARRAY['rate3'], 'm', 1, NULL)`,
			`SELECT retry_after_us, reset_after_us, period_us FROM pgquota.grant_limits_row(ARRAY['rate3'], 'm', 1, NULL)`,
			[3]int64{334, 1_000, 1_000}},
		{"limit_usage, rate", `SELECT refill_after_ms, reset_after_ms, period_ms FROM pgquota.limit_usage('rate3', 'm')`,
			`SELECT refill_after_us, reset_after_us, period_us FROM pgquota.limit_usage_row('rate3', 'm')`,
			[3]int64{334, 1_000, 1_000}},
		{"limit_usage, day", `SELECT refill_after_ms, reset_after_ms, period_ms FROM pgquota.limit_usage('day', 'm')`,
			`SELECT refill_after_us, reset_after_us, coalesce(period_us, 0) FROM pgquota.limit_usage_row('day', 'm')`,
			[3]int64{43_200_000, 43_200_000, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ms, us [3]int64
			require.NoError(t, b.pool.QueryRow(b.ctx, c.public).Scan(&ms[0], &ms[1], &ms[2]))
			require.NoError(t, b.pool.QueryRow(b.ctx, c.row).Scan(&us[0], &us[1], &us[2]))
			for i := range ms {
				require.Equal(t, ceilMS(us[i]), ms[i], "duration %d: %d us", i, us[i])
			}
			require.Equal(t, c.want, ms)
		})
	}
}

// ceilMS is pgquota.ms_ceil: microseconds rounded up to milliseconds, 0
// and negative figures kept.
func ceilMS(us int64) int64 {
	if us <= 0 {
		return us
	}
	return (us + 999) / 1000
}
