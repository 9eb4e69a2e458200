package quota_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// 256 concurrent callers on two clients grant against a day quota of 1,000
// (the first limit) and a rate of 40 per hour (the second, "a-rate" sorts
// first so callers lock in another order than they name): exactly 40 are
// granted, every denial names the rate with a positive RetryAfter, and the
// day counter holds exactly the 40 granted units (no denied call moved it).
// Half the callers name the quotas in the other order: no deadlock.
func TestGrantMultiDeniedBySecondLimitLeavesFirstUnchanged(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "z-day", Window: quota.WindowDay, DefaultLimit: ptr(int64(1000))})
	b.define(t, quota.Definition{Name: "a-rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(40)), Period: time.Hour, Burst: 40})
	second, err := quota.New(b.pool, testConfig(t, nil))
	require.NoError(t, err)
	clients := []*quota.Client{b.client, second}

	const n = 256
	var granted, denied atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			qs := []string{"z-day", "a-rate"}
			if i%2 == 1 {
				qs = []string{"a-rate", "z-day"}
			}
			res, err := clients[i%2].Grant(b.ctx, quota.GrantRequest{Quotas: qs, Member: "m", Amount: 1})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
				return
			}
			if res.Granted {
				granted.Add(1)
				if res.DeniedBy != "" {
					t.Errorf("granted with DeniedBy %q", res.DeniedBy)
				}
				return
			}
			denied.Add(1)
			if res.DeniedBy != "a-rate" || res.RetryAfter <= 0 || len(res.Limits) != 2 {
				t.Errorf("denial: DeniedBy %q, RetryAfter %s, %d limits", res.DeniedBy, res.RetryAfter, len(res.Limits))
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	require.Equal(t, int64(40), granted.Load())
	require.Equal(t, int64(n-40), denied.Load())
	sum, _ := b.usageRows(t, "z-day", "m")
	require.Equal(t, int64(40), sum, "the day counter moved only with the granted calls")
}

// With the clock pinned: "3 per second and 10 per hour" (the Done-when
// check): the 11th call within the hour is refused by the hourly limit, and
// the per-second state stays where it was; the result names the earliest
// retry (the end of the hour) and carries each limit's outcome.
func TestGrantMultiRefusedByHourlyLimitLeavesRateState(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "per-second", Window: quota.WindowRate, DefaultLimit: ptr(int64(3)), Period: time.Second})
	b.define(t, quota.Definition{Name: "per-hour", Window: quota.WindowHour, DefaultLimit: ptr(int64(10))})
	tat := func() string {
		var s string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT tat_us::text FROM pgquota.rate_state WHERE quota_name = 'per-second'`).Scan(&s))
		return s
	}
	req := quota.GrantRequest{Quotas: []string{"per-second", "per-hour"}, Member: "m", Amount: 1}
	for i := range 10 {
		b.setClock(t, time.Date(2026, 3, 1, 12, 0, i, 0, time.UTC).Format(time.RFC3339))
		res, err := b.client.Grant(b.ctx, req)
		require.NoError(t, err)
		require.True(t, res.Granted, "call %d", i+1)
	}
	before := tat()
	b.setClock(t, "2026-03-01T12:00:30Z")
	res, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Equal(t, "per-hour", res.DeniedBy)
	require.Equal(t, 59*time.Minute+30*time.Second, res.RetryAfter, "until the hour ends")
	require.Len(t, res.Limits, 2)
	require.True(t, res.Limits[0].Fits)
	require.False(t, res.Limits[1].Fits)
	require.Equal(t, int64(10), res.Limits[1].Used)
	require.Equal(t, before, tat(), "the per-second state stays put")
	sum, _ := b.usageRows(t, "per-hour", "m")
	require.Equal(t, int64(10), sum)

	// An unknown quota in the list: ErrQuotaNotFound naming it, nothing written.
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quotas: []string{"per-second", "nope"}, Member: "m2", Amount: 1})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
	require.ErrorContains(t, err, `"nope"`)
	require.Equal(t, int64(0), b.countWhere(t, "rate_state", "member = 'm2'"))
	// No limit for one: ErrNoLimit, nothing written.
	b.define(t, quota.Definition{Name: "unlimited", Window: quota.WindowDay})
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quotas: []string{"per-second", "unlimited"}, Member: "m3", Amount: 1})
	require.True(t, errors.Is(err, quota.ErrNoLimit), "%v", err)
	require.Equal(t, int64(0), b.countWhere(t, "rate_state", "member = 'm3'"))
	require.Equal(t, int64(0), b.countWhere(t, "usage", "member = 'm3'"))
}

// countWhere counts the rows of a pgquota table matching cond.
func (b *testBundle) countWhere(t *testing.T, table, cond string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.`+table+` WHERE `+cond).Scan(&n))
	return n
}
