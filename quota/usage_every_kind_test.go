package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Usage answers for every kind of quota and writes nothing. After grants of
// 3 and 2 units on a rate (10/h, burst 8), a fixed window (10 per hour), a
// rolling window (10 in any hour) and a calendar day (10), Usage reports
// the Used and Remaining that the next grant reports: a grant of
// Remaining+1 is denied with that same Remaining, and a grant of
// Remaining then fits and leaves 0. Its waits are those of the grant path
// at Usage's instant (DBNow), to the microsecond: ResetAfter is the grant's
// ResetAfter plus the time between the two reads (both from the database
// clock), and RefillAfter is when the oldest rolling grant leaves, the
// rate's next unit, the window's end.
func TestUsageEveryKindMatchesTheNextGrant(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const hour = time.Hour
	b.define(t, quota.Definition{Name: "rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(10)), Period: hour, Burst: 8})
	b.define(t, quota.Definition{Name: "fixed", Window: quota.WindowFixed, DefaultLimit: ptr(int64(10)), Period: hour})
	b.define(t, quota.Definition{Name: "rolling", Window: quota.WindowRolling, DefaultLimit: ptr(int64(10)), Period: hour})
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr(int64(10))})
	const emission = hour / 10 // the rate's T

	for _, tc := range []struct {
		kind      string
		window    quota.Window
		remaining int64 // after 3 + 2 units
	}{
		{"rate", quota.WindowRate, 3}, // burst 8 - 5
		{"fixed", quota.WindowFixed, 5},
		{"rolling", quota.WindowRolling, 5},
		{"day", quota.WindowDay, 5},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			fresh, err := b.client.Usage(b.ctx, tc.kind, "nobody")
			require.NoError(t, err)
			require.Equal(t, tc.window, fresh.Window)
			require.Zero(t, fresh.Used, "a member without state")
			require.Equal(t, tc.remaining+5, fresh.Remaining, "the full limit (the burst for a rate)")
			require.Zero(t, fresh.RefillAfter)

			var first, last quota.GrantResult
			for i, n := range []int64{3, 2} {
				res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: tc.kind, Member: "m", Amount: n})
				require.NoError(t, err)
				require.True(t, res.Granted)
				if i == 0 {
					first = res
				}
				last = res
			}

			u, err := b.client.Usage(b.ctx, tc.kind, "m")
			require.NoError(t, err)
			t.Logf("%s: used %d remaining %d reset after %s refill after %s", tc.kind, u.Used, u.Remaining, u.ResetAfter, u.RefillAfter)
			require.Equal(t, tc.kind, u.Quota)
			require.Equal(t, tc.window, u.Window)
			require.True(t, u.HasLimit)
			require.Equal(t, int64(10), u.Limit)
			require.Equal(t, tc.remaining, u.Remaining)
			require.Equal(t, int64(5), u.Used, "the units granted (a rate's burst - remaining)")
			require.False(t, u.DBNow.Before(last.DecidedAt), "read after the grants")

			switch tc.kind {
			case "rate":
				require.Equal(t, int64(8), u.Burst)
				require.Equal(t, hour, u.Period)
				// TAT = first decision + 5T: full again then; the 4th unit
				// back 4T earlier.
				require.Equal(t, first.DecidedAt.Add(5*emission).Sub(u.DBNow), u.ResetAfter)
				require.Equal(t, first.DecidedAt.Add(emission).Sub(u.DBNow), u.RefillAfter)
				require.True(t, u.WindowStart.IsZero() && u.WindowEnd.IsZero())
			case "rolling":
				require.Equal(t, hour, u.Period)
				require.Equal(t, last.DecidedAt.Add(hour).Sub(u.DBNow), u.ResetAfter, "the newest grant leaves")
				require.Equal(t, first.DecidedAt.Add(hour).Sub(u.DBNow), u.RefillAfter, "the oldest grant leaves")
				require.True(t, u.WindowStart.IsZero() && u.WindowEnd.IsZero())
			default:
				require.Equal(t, last.WindowStart, u.WindowStart)
				require.Equal(t, last.WindowEnd, u.WindowEnd)
				require.Equal(t, u.WindowEnd.Sub(u.DBNow), u.ResetAfter)
				require.Equal(t, u.ResetAfter, u.RefillAfter)
			}

			denied, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: tc.kind, Member: "m", Amount: u.Remaining + 1})
			require.NoError(t, err)
			require.False(t, denied.Granted)
			require.Equal(t, u.Remaining, denied.Remaining, "the denial reports Usage's remaining")
			require.Equal(t, u.Used, denied.Used)
			if tc.kind != "day" { // a calendar grant on its own reports no waits
				require.Equal(t, u.ResetAfter-denied.DecidedAt.Sub(u.DBNow), denied.ResetAfter)
			}

			rest, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: tc.kind, Member: "m", Amount: u.Remaining})
			require.NoError(t, err)
			require.True(t, rest.Granted, "Usage's remaining fits")
			require.Zero(t, rest.Remaining)
			after, err := b.client.Usage(b.ctx, tc.kind, "m")
			require.NoError(t, err)
			require.Zero(t, after.Remaining)
		})
	}

	// A rate of limit 0 never refills; Usage says so as the grant does.
	_, err := b.operator.SetMemberLimit(b.ctx, "rate", "zero", 0)
	require.NoError(t, err)
	u, err := b.client.Usage(b.ctx, "rate", "zero")
	require.NoError(t, err)
	require.Zero(t, u.Remaining)
	require.Equal(t, quota.Never, u.ResetAfter)
	require.Equal(t, quota.Never, u.RefillAfter)

	// Usage wrote nothing: no state for the members it alone read.
	for _, table := range []string{"usage", "rate_state", "rolling_usage"} {
		var n int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.`+table+` WHERE member <> 'm'`).Scan(&n))
		require.Zero(t, n, "rows of pgquota.%s for members only Usage read", table)
	}
}
