package quota_test

import (
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// At a rate's exact refill instants the decision, Remaining and the waits
// agree, for rates whose emission interval (period/limit) is not a whole
// number of microseconds, with the clock pinned: take the whole burst at t0;
// one microsecond before t0 + period the burst is denied with RetryAfter 1
// us and Remaining floor((period-1us) * limit / period); at exactly t0 +
// period Usage reports the burst back, and the burst is granted with
// ResetAfter exactly one period. 6/s also at its half-period instant (3
// units back exactly at t0 + 500 ms).
func TestRateRefillInstantsAreExact(t *testing.T) {
	t.Parallel()
	const t0 = "2026-03-01T12:00:00.123457Z"
	base, err := time.Parse(time.RFC3339Nano, t0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		limit  int64
		period time.Duration
	}{
		{"6 per second", 6, time.Second},
		{"7 per minute", 7, time.Minute},
		{"3 per 7 seconds", 3, 7 * time.Second},
		{"the largest limit per second", quota.MaxUnits, time.Second},
		{"the largest limit per 7 seconds", quota.MaxUnits, 7 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			at := func(d time.Duration) { b.setClock(t, base.Add(d).Format(time.RFC3339Nano)) }
			b.define(t, quota.Definition{Name: "r", Window: quota.WindowRate, DefaultLimit: ptr(tc.limit), Period: tc.period, Burst: tc.limit})
			grant := func(amount int64) quota.GrantResult {
				t.Helper()
				res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "m", Amount: amount})
				require.NoError(t, err)
				return res
			}
			usage := func() quota.Usage {
				t.Helper()
				u, err := b.client.Usage(b.ctx, "r", "m")
				require.NoError(t, err)
				return u
			}

			at(0)
			r := grant(tc.limit)
			require.True(t, r.Granted, "the whole burst at t0")
			require.Zero(t, r.Remaining)
			require.Equal(t, tc.period, r.ResetAfter, "back to full exactly one period later")

			// One microsecond before the refill instant.
			at(tc.period - time.Microsecond)
			p := big.NewInt(tc.period.Microseconds())
			left := new(big.Int).Mul(big.NewInt(tc.limit), new(big.Int).Sub(p, big.NewInt(1)))
			left.Div(left, p)
			r = grant(tc.limit)
			require.False(t, r.Granted, "1 us before the refill instant")
			require.Equal(t, time.Microsecond, r.RetryAfter, "RetryAfter 1 us before the refill instant")
			require.Equal(t, time.Microsecond, r.ResetAfter)
			require.Equal(t, left.Int64(), r.Remaining, "units back 1 us before the refill instant")
			u := usage()
			require.Equal(t, left.Int64(), u.Remaining, "Usage 1 us before the refill instant")
			require.Equal(t, time.Microsecond, u.ResetAfter)

			// At the refill instant exactly.
			at(tc.period)
			u = usage()
			require.Equal(t, tc.limit, u.Remaining, "Usage at the refill instant")
			require.Zero(t, u.ResetAfter, "Usage at the refill instant")
			r = grant(tc.limit)
			require.True(t, r.Granted, "the whole burst at the refill instant: RetryAfter %s, Remaining %d", r.RetryAfter, r.Remaining)
			require.Zero(t, r.RetryAfter)
			require.Zero(t, r.Remaining)
			require.Equal(t, tc.period, r.ResetAfter, "ResetAfter after the burst at the refill instant")
			r = grant(1)
			require.False(t, r.Granted)
			require.Zero(t, r.Remaining)
			// One emission interval, period/limit, rounded up.
			interval := new(big.Int).Add(p, big.NewInt(tc.limit-1))
			interval.Div(interval, big.NewInt(tc.limit))
			require.Equal(t, time.Duration(interval.Int64())*time.Microsecond, r.RetryAfter, "one emission interval, rounded up")
		})
	}

	t.Run("6 per second at half a period", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 2)
		at := func(d time.Duration) { b.setClock(t, base.Add(d).Format(time.RFC3339Nano)) }
		b.define(t, quota.Definition{Name: "r", Window: quota.WindowRate, DefaultLimit: ptr(int64(6)), Period: time.Second, Burst: 6})
		grant := func(amount int64) quota.GrantResult {
			t.Helper()
			res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "m", Amount: amount})
			require.NoError(t, err)
			return res
		}
		at(0)
		require.True(t, grant(6).Granted)
		at(500 * time.Millisecond)
		r := grant(4)
		require.False(t, r.Granted)
		require.Equal(t, int64(3), r.Remaining, "three emission intervals: exactly 3 units")
		require.Equal(t, 166667*time.Microsecond, r.RetryAfter, "the fourth unit: 1/6 s later, rounded up")
		require.Equal(t, 500*time.Millisecond, r.ResetAfter)
		r = grant(3)
		require.True(t, r.Granted, "3 units at exactly t0 + 500 ms: RetryAfter %s", r.RetryAfter)
		require.Zero(t, r.Remaining)
		require.Equal(t, time.Second, r.ResetAfter)
	})
}
