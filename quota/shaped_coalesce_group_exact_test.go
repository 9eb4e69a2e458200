package quota_test

import (
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// shapedPaths are the two ways a Client shares statements between
// concurrent Grant calls. Each returns a client on b's pool and a function
// that reports the most calls one statement decided.
var shapedPaths = []struct {
	name   string
	client func(t *testing.T, b *testBundle) (*quota.Client, func() int64)
}{
	{"coalesce", func(t *testing.T, b *testBundle) (*quota.Client, func() int64) {
		var most atomic.Int64
		c := b.coalescing(t, quota.Config{})
		quota.SetCoalesceSend(c, func(n int) { storeMax(&most, int64(n)) })
		return c, most.Load
	}},
	{"group", func(t *testing.T, b *testBundle) (*quota.Client, func() int64) {
		var most atomic.Int64
		c := b.grouping(t, quota.Config{}, 0, func(reqs []quota.GrantRequest) { storeMax(&most, int64(len(reqs))) })
		return c, most.Load
	}},
}

func storeMax(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// burstGrants runs n concurrent Grant calls through c, in waves of 32
// calls at once, a wave every gap, amount(i) units each, and returns the
// results.
func burstGrants(t *testing.T, b *testBundle, c *quota.Client, req quota.GrantRequest, n int, gap time.Duration, amount func(i int) int64) []quota.GrantResult {
	t.Helper()
	results := make([]quota.GrantResult, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(time.Duration(i/32) * gap)))
			r := req
			r.Amount = amount(i)
			res, err := c.Grant(b.ctx, r)
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	return results
}

// 256 concurrent Grant calls on one rate quota (100/s, burst 10), in waves,
// through Config.Coalesce and through Config.GroupCommit: some statement
// decided several calls, and the number granted, and each decision at a
// distinct instant, equal what GCRA decides for the instants the database
// recorded; the stored TAT equals the replay's.
func TestRateThroughCoalesceAndGroupCommitGrantsGCRAExactBound(t *testing.T) {
	t.Parallel()
	for _, path := range shapedPaths {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 16)
			b.define(t, quota.Definition{Name: "api", Window: quota.WindowRate, DefaultLimit: ptr(int64(100)), Period: time.Second, Burst: 10})
			c, most := path.client(t, b)
			const n = 256
			results := burstGrants(t, b, c, quota.GrantRequest{Quota: "api", Member: "m"}, n, 100*time.Millisecond, func(int) int64 { return 1 })
			require.Greater(t, most(), int64(1), "no statement decided several calls")

			sort.SliceStable(results, func(i, j int) bool { return results[i].DecidedAt.Before(results[j].DecidedAt) })
			arrivals := make([]int64, n)
			granted := 0
			for i, r := range results {
				require.False(t, r.DecidedAt.IsZero())
				require.Len(t, r.Limits, 1)
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
				if (i == 0 || arrivals[i] != arrivals[i-1]) && (i == n-1 || arrivals[i] != arrivals[i+1]) {
					require.Equal(t, want[i], results[i].Granted, "decision at %d (arrival %d us)", i, arrivals[i])
				}
			}
			require.Equal(t, wantGranted, granted, "granted count against GCRA's exact bound for the recorded arrivals")
			var stored int64
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT tat_us::bigint FROM pgquota.rate_state WHERE quota_name = 'api' AND member = 'm'`).Scan(&stored))
			require.Equal(t, tat, stored, "stored TAT")
			require.Less(t, granted, n, "the waves should exceed the rate")
			t.Logf("%s: granted %d of %d over %d us (GCRA replay %d), most calls in one statement %d",
				path.name, granted, n, arrivals[n-1]-arrivals[0], wantGranted, most())
		})
	}
}

// 256 concurrent grants of 1 to 3 units against "at most 20 in any
// 300 ms", in waves, through Config.Coalesce and Config.GroupCommit: some
// statement decided several calls, no half-open interval of 300 ms holds
// more than 20 granted units (by the instants the database recorded), and
// every denial was needed.
func TestRollingThroughCoalesceAndGroupCommitNoIntervalAboveLimit(t *testing.T) {
	t.Parallel()
	for _, path := range shapedPaths {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 16)
			const limit, w = 20, 300 * time.Millisecond
			b.define(t, quota.Definition{Name: "roll", Window: quota.WindowRolling, DefaultLimit: ptr(int64(limit)), Period: w})
			c, most := path.client(t, b)
			const n = 256
			results := burstGrants(t, b, c, quota.GrantRequest{Quota: "roll", Member: "m"}, n, 100*time.Millisecond, func(i int) int64 { return int64(1 + i%3) })
			require.Greater(t, most(), int64(1), "no statement decided several calls")
			sort.SliceStable(results, func(i, j int) bool { return results[i].DecidedAt.Before(results[j].DecidedAt) })
			granted, denied := 0, 0
			for i, o := range results {
				if o.Granted {
					granted++
					var sum int64
					for _, p := range results[i:] {
						if p.Granted && p.DecidedAt.Sub(o.DecidedAt) < w {
							sum += p.Amount
						}
					}
					require.LessOrEqual(t, sum, int64(limit), "units in [%s, +%s)", o.DecidedAt.Format(time.RFC3339Nano), w)
					continue
				}
				denied++
				var sum int64
				for _, p := range results {
					if p.Granted && !p.DecidedAt.After(o.DecidedAt) && o.DecidedAt.Sub(p.DecidedAt) < w {
						sum += p.Amount
					}
				}
				require.Greater(t, sum+o.Amount, int64(limit), "denial at %s of %d was not needed (%d in the window)", o.DecidedAt.Format(time.RFC3339Nano), o.Amount, sum)
			}
			require.Greater(t, granted, 0)
			require.Greater(t, denied, 0)
			t.Logf("%s: granted %d, denied %d, most calls in one statement %d", path.name, granted, denied, most())
		})
	}
}
