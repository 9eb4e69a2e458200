package quota_test

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Concurrent grants of 1 to 3 units from two clients against "at most 20 in
// any 500 ms" over about 2 s: no half-open interval of length 500 ms holds
// more than 20 granted units (by the instants the database recorded), and
// every denial was needed: the grants of the 500 ms before it plus its
// amount exceed 20.
func TestRollingWindowNoIntervalHoldsMoreThanTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	const limit, w = 20, 500 * time.Millisecond
	b.define(t, quota.Definition{Name: "roll", Window: quota.WindowRolling, DefaultLimit: ptr(int64(limit)), Period: w})
	second, err := quota.New(b.pool, testConfig(t, nil))
	require.NoError(t, err)
	clients := []*quota.Client{b.client, second}

	const n = 400
	type outcome struct {
		at      time.Time
		amount  int64
		granted bool
	}
	out := make([]outcome, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(time.Duration(i) * 2 * time.Second / n)))
			amount := int64(1 + i%3)
			res, err := clients[i%2].Grant(b.ctx, quota.GrantRequest{Quota: "roll", Member: "m", Amount: amount})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
				return
			}
			out[i] = outcome{res.DecidedAt, amount, res.Granted}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })

	granted, denied := 0, 0
	for i, o := range out {
		if o.granted {
			granted++
			// The interval [o.at, o.at + w): the maximum over all intervals
			// is reached at one that starts at a grant.
			var sum int64
			for _, p := range out[i:] {
				if p.granted && p.at.Sub(o.at) < w {
					sum += p.amount
				}
			}
			require.LessOrEqual(t, sum, int64(limit), "units in [%s, +%s)", o.at.Format(time.RFC3339Nano), w)
			continue
		}
		denied++
		var sum int64
		for _, p := range out {
			if p.granted && !p.at.After(o.at) && o.at.Sub(p.at) < w {
				sum += p.amount
			}
		}
		require.Greater(t, sum+o.amount, int64(limit), "denial at %s of %d was not needed (%d in the window)", o.at.Format(time.RFC3339Nano), o.amount, sum)
	}
	require.Greater(t, granted, 0)
	require.Greater(t, denied, 0)
	// The row keeps only the last window's grants: at most limit entries.
	var entries int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT cardinality(stamps) FROM pgquota.rolling_usage WHERE quota_name = 'roll' AND member = 'm'`).Scan(&entries))
	require.LessOrEqual(t, entries, limit)
	t.Logf("granted %d, denied %d", granted, denied)
}

// With the clock pinned: RetryAfter is when enough of the oldest grants have
// left the window, ResetAfter when the newest has.
func TestRollingWindowRetryAfterWithPinnedClock(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "roll", Window: quota.WindowRolling, DefaultLimit: ptr(int64(5)), Period: 10 * time.Second})
	grant := func(at string, amount int64) quota.GrantResult {
		b.setClock(t, at)
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "roll", Member: "m", Amount: amount})
		require.NoError(t, err)
		return res
	}
	require.True(t, grant("2026-03-01 12:00:00+00", 2).Granted)
	r := grant("2026-03-01 12:00:03+00", 3)
	require.True(t, r.Granted)
	require.Equal(t, int64(5), r.Used)
	require.Equal(t, 10*time.Second, r.ResetAfter)
	r = grant("2026-03-01 12:00:04+00", 2)
	require.False(t, r.Granted)
	require.Equal(t, 6*time.Second, r.RetryAfter, "the 2 units of 12:00:00 leave at 12:00:10")
	require.Equal(t, 9*time.Second, r.ResetAfter)
	r = grant("2026-03-01 12:00:04+00", 3)
	require.Equal(t, 9*time.Second, r.RetryAfter, "3 units need the grant of 12:00:03 gone too")
	r = grant("2026-03-01 12:00:04+00", 6)
	require.Equal(t, quota.Never, r.RetryAfter)
	require.False(t, grant("2026-03-01 12:00:09.999999+00", 1).Granted)
	r = grant("2026-03-01 12:00:10+00", 2)
	require.True(t, r.Granted, "at exactly W after the first grant, it has left")
	require.Equal(t, int64(5), r.Used)
}

// Fixed windows of any length, cut at the origin: a counter per window, and
// windows before the origin tile time too.
func TestFixedWindowsAlignToTheOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	origin := time.Date(2026, 1, 5, 6, 0, 0, 0, time.UTC)
	b.define(t, quota.Definition{Name: "shift", Window: quota.WindowFixed, DefaultLimit: ptr(int64(2)), Period: 36 * time.Hour, Origin: origin})
	b.define(t, quota.Definition{Name: "ten", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: 10 * time.Second})
	cases := []struct {
		quota, at  string
		start, end string
		granted    bool
	}{
		{"shift", "2026-01-07 00:00:00+00", "2026-01-06T18:00:00Z", "2026-01-08T06:00:00Z", true},
		{"shift", "2026-01-08 05:59:59.999999+00", "2026-01-06T18:00:00Z", "2026-01-08T06:00:00Z", true},
		{"shift", "2026-01-08 05:59:59.999999+00", "2026-01-06T18:00:00Z", "2026-01-08T06:00:00Z", false},
		{"shift", "2026-01-08 06:00:00+00", "2026-01-08T06:00:00Z", "2026-01-09T18:00:00Z", true},
		{"shift", "2026-01-04 12:00:00+00", "2026-01-03T18:00:00Z", "2026-01-05T06:00:00Z", true},
		{"ten", "2026-01-07 12:00:07+00", "2026-01-07T12:00:00Z", "2026-01-07T12:00:10Z", true},
		{"ten", "2026-01-07 12:00:09+00", "2026-01-07T12:00:00Z", "2026-01-07T12:00:10Z", false},
		{"ten", "2026-01-07 12:00:10+00", "2026-01-07T12:00:10Z", "2026-01-07T12:00:20Z", true},
	}
	for _, c := range cases {
		b.setClock(t, c.at)
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: c.quota, Member: "m", Amount: 1})
		require.NoError(t, err)
		require.Equal(t, c.granted, res.Granted, "%s at %s", c.quota, c.at)
		require.Equal(t, c.start, res.WindowStart.UTC().Format(time.RFC3339), "%s at %s", c.quota, c.at)
		require.Equal(t, c.end, res.WindowEnd.UTC().Format(time.RFC3339), "%s at %s", c.quota, c.at)
		if !c.granted {
			require.Equal(t, res.WindowEnd.Sub(res.DecidedAt), res.RetryAfter)
		}
	}
	sum, rows := b.usageRows(t, "shift", "m")
	require.Equal(t, int64(4), sum)
	require.Equal(t, int64(3), rows)
	q, err := b.client.Quota(b.ctx, "shift")
	require.NoError(t, err)
	require.Equal(t, 36*time.Hour, q.Period)
	require.True(t, origin.Equal(q.Origin))
}
