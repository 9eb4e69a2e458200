package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// At the last microsecond of a long fixed window far from its origin (30
// days, origin 1000-01-01: window 12174, which ends 2000-01-09), Usage
// (pgquota.limit_usage) and the next Grant agree on the window: [start,
// start + 30 days), 1 us to its end, before and after the grant. The
// window was cut by rounded division in limit_usage (the quotient kept 12
// decimal places, and 12174.99999999999961 rounded to 12175), which put
// that microsecond in the next window: Usage reported the next window,
// with nothing used, while the grant counted in this one.
func TestUsageAtLastMicrosecondOfLongFixedWindowAgreesWithGrant(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	origin := time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	const days = 30
	b.define(t, quota.Definition{Name: "month30", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: days * 24 * time.Hour, Origin: origin})
	start := origin.AddDate(0, 0, 12174*days)
	end := start.AddDate(0, 0, days)
	last := end.Add(-time.Microsecond)
	require.Equal(t, time.Date(2000, 1, 8, 23, 59, 59, 999999000, time.UTC), last)
	b.setClock(t, last.Format(time.RFC3339Nano))

	u, err := b.client.Usage(b.ctx, "month30", "m")
	require.NoError(t, err)
	require.Equal(t, start, u.WindowStart.UTC(), "Usage's window")
	require.Equal(t, end, u.WindowEnd.UTC(), "Usage's window")
	require.Equal(t, time.Microsecond, u.ResetAfter)
	require.Equal(t, int64(0), u.Used)
	require.Equal(t, int64(1), u.Remaining)

	r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "month30", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Equal(t, start, r.WindowStart.UTC(), "the grant's window")
	require.Equal(t, end, r.WindowEnd.UTC(), "the grant's window")

	u, err = b.client.Usage(b.ctx, "month30", "m")
	require.NoError(t, err)
	require.Equal(t, start, u.WindowStart.UTC())
	require.Equal(t, int64(1), u.Used, "Usage sees the grant")
	require.Equal(t, int64(0), u.Remaining)

	var ws, we time.Time
	var used, reset int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT window_start, window_end, used, reset_after_ms FROM pgquota.limit_usage('month30', 'm')`).
		Scan(&ws, &we, &used, &reset))
	require.Equal(t, start, ws.UTC())
	require.Equal(t, end, we.UTC())
	require.Equal(t, int64(1), used)
	require.Equal(t, int64(1), reset, "the window's last microsecond, rounded up to a millisecond")
}
