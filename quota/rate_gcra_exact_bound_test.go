package quota_test

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// gcraReplay decides arrivals (microseconds, in order) by GCRA with
// emission interval t and tolerance tau (burst*t), amount 1 each, from an
// empty state, and returns the decisions and the final TAT.
func gcraReplay(arrivals []int64, t, tau int64) ([]bool, int64) {
	var tat int64
	out := make([]bool, len(arrivals))
	for i, now := range arrivals {
		base := max(tat, now)
		if base+t-tau <= now {
			out[i] = true
			tat = base + t
		}
	}
	return out, tat
}

// 1,000 concurrent requests spread over 2 s, from two clients (replicas),
// against 100/s with a burst of 10: the number granted, and each decision,
// equal what GCRA decides for the instants the database recorded
// (GrantResult.DecidedAt), and the stored TAT equals the replay's.
func TestRateGCRAGrantsExactlyTheBoundForRecordedArrivals(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "api", Window: quota.WindowRate, DefaultLimit: ptr(int64(100)), Period: time.Second, Burst: 10})
	second, err := quota.New(b.pool, testConfig(t, nil))
	require.NoError(t, err)
	clients := []*quota.Client{b.client, second}

	const n = 1000
	results := make([]quota.GrantResult, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(time.Duration(i) * 2 * time.Second / n)))
			res, err := clients[i%2].Grant(b.ctx, quota.GrantRequest{Quota: "api", Member: "m", Amount: 1})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())

	sort.SliceStable(results, func(i, j int) bool { return results[i].DecidedAt.Before(results[j].DecidedAt) })
	arrivals := make([]int64, n)
	granted := 0
	for i, r := range results {
		require.False(t, r.DecidedAt.IsZero())
		arrivals[i] = r.DecidedAt.UnixMicro()
		if r.Granted {
			granted++
		}
	}
	want, tat := gcraReplay(arrivals, 10000, 10*10000)
	wantGranted := 0
	for i := range want {
		if want[i] {
			wantGranted++
		}
	}
	require.Equal(t, wantGranted, granted, "granted count against GCRA's exact bound for the recorded arrivals")
	// Decisions at distinct instants must match one by one (equal instants
	// are interchangeable: their count is what matters).
	for i := range want {
		if (i == 0 || arrivals[i] != arrivals[i-1]) && (i == n-1 || arrivals[i] != arrivals[i+1]) {
			require.Equal(t, want[i], results[i].Granted, "decision at %d (arrival %d us)", i, arrivals[i])
		}
	}
	var stored int64
	var whole bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT tat_us::bigint, tat_us = trunc(tat_us) FROM pgquota.rate_state WHERE quota_name = 'api' AND member = 'm'`).Scan(&stored, &whole))
	require.True(t, whole, "100/s: the TAT moves in whole 10 ms steps")
	require.Equal(t, tat, stored, "stored TAT")
	// The bound itself: burst + elapsed/T (+1 for the first emission).
	span := arrivals[n-1] - arrivals[0]
	require.LessOrEqual(t, int64(granted), 10+span/10000+1)
	require.Greater(t, granted, 150, "the run should span about 2 s: %d us", span)
	t.Logf("granted %d of %d over %d us (GCRA replay: %d)", granted, n, span, wantGranted)
}

// With the clock pinned: the burst, amounts above 1, RetryAfter and
// ResetAfter as redis_rate computes them, and a denial leaving the TAT.
func TestRateGCRAResultsWithPinnedClock(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.setClock(t, "2026-03-01 12:00:00+00")
	b.define(t, quota.Definition{Name: "r", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Minute, Burst: 5})
	grant := func(amount int64) quota.GrantResult {
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "m", Amount: amount})
		require.NoError(t, err)
		return res
	}
	r := grant(3)
	require.True(t, r.Granted)
	require.Equal(t, int64(2), r.Remaining)
	require.Equal(t, time.Duration(0), r.RetryAfter)
	require.Equal(t, 36*time.Second, r.ResetAfter)
	require.Len(t, r.Limits, 1)
	require.Equal(t, quota.WindowRate, r.Limits[0].Window)
	require.Equal(t, int64(5), r.Limits[0].Burst)

	r = grant(3) // 2 left: denied, one more unit comes in 12 s
	require.False(t, r.Granted)
	require.Equal(t, "r", r.DeniedBy)
	require.Equal(t, int64(2), r.Remaining)
	require.Equal(t, 12*time.Second, r.RetryAfter)
	require.Equal(t, 36*time.Second, r.ResetAfter)

	r = grant(2)
	require.True(t, r.Granted)
	require.Equal(t, int64(0), r.Remaining)
	require.Equal(t, time.Minute, r.ResetAfter)

	r = grant(1)
	require.False(t, r.Granted)
	require.Equal(t, 12*time.Second, r.RetryAfter)

	r = grant(6) // above the burst: never
	require.False(t, r.Granted)
	require.Equal(t, quota.Never, r.RetryAfter)

	b.setClock(t, "2026-03-01 12:00:24+00") // two emission intervals later
	r = grant(2)
	require.True(t, r.Granted)
	require.Equal(t, int64(0), r.Remaining)
	r = grant(1)
	require.False(t, r.Granted)
	require.Equal(t, 12*time.Second, r.RetryAfter)

	// A member's own limit replaces the rate's count (burst stays 5).
	_, err := b.operator.SetMemberLimit(b.ctx, "r", "fast", 60)
	require.NoError(t, err)
	rf, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "fast", Amount: 5})
	require.NoError(t, err)
	require.True(t, rf.Granted)
	rf, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "fast", Amount: 1})
	require.NoError(t, err)
	require.False(t, rf.Granted)
	require.Equal(t, time.Second, rf.RetryAfter, "60/min: one unit per second")
}
