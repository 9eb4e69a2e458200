package quota_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A rate of 1 unit per 36525 days (the longest period) with a burst of
// 10,000: a grant of the whole burst leaves a wait of 10,000 periods.
//   - 10 units: reset 1,000 years, above time.Duration's ~292 years: the
//     result saturates at math.MaxInt64 instead of wrapping.
//   - 10,000 units: reset ~3.2e19 us, above bigint: the SQL clamps instead
//     of failing with 22003 (numeric out of range), and nothing is lost.
func TestRateHugeWaitClamped(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	period := 36525 * 24 * time.Hour
	b.define(t, quota.Definition{Name: "slow", Window: quota.WindowRate, DefaultLimit: ptr(int64(1)), Period: period, Burst: 10000})
	for _, tc := range []struct {
		member string
		amount int64
	}{{"thousand-years", 10}, {"beyond-bigint", 10000}} {
		t.Run(tc.member, func(t *testing.T) {
			res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "slow", Member: tc.member, Amount: tc.amount})
			require.NoError(t, err)
			require.True(t, res.Granted)
			require.Equal(t, time.Duration(math.MaxInt64), res.ResetAfter, "ResetAfter")
			require.Equal(t, time.Duration(math.MaxInt64), res.Limits[0].ResetAfter)
			require.Zero(t, res.RetryAfter)

			res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "slow", Member: tc.member, Amount: 10000 - tc.amount + 1})
			require.NoError(t, err)
			require.False(t, res.Granted, "one unit more than the burst left")
			// One emission interval, less the time elapsed since the first grant.
			require.LessOrEqual(t, res.RetryAfter, period, "RetryAfter of the refusal")
			require.Greater(t, res.RetryAfter, period-time.Minute, "RetryAfter of the refusal")
			require.Equal(t, time.Duration(math.MaxInt64), res.ResetAfter)
		})
	}
}
