package quota_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// stepClock makes pgquota.clock() in this test's database move on by step
// at every reading, from start: each reading is a later instant, whatever
// the load, so a boundary passes between any two readings of one call
// about as often as step is a share of the window.
func (b *testBundle) stepClock(t *testing.T, start time.Time, step time.Duration) {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, fmt.Sprintf(`
		CREATE SEQUENCE public.test_clock_tick;
		GRANT USAGE ON SEQUENCE public.test_clock_tick TO PUBLIC;
		CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
			LANGUAGE sql VOLATILE AS $$ SELECT '%s'::timestamptz + nextval('public.test_clock_tick') * interval '%d microseconds' $$`,
		start.UTC().Format(time.RFC3339Nano), step.Microseconds()))
	require.NoError(t, err)
}

// decision is what checkDecisions needs of one fixed-window outcome.
type decision struct {
	granted, fits        bool
	start, end, at       time.Time
	retryAfter, resetAft time.Duration
}

func decisionOf(r quota.GrantResult, quotaName string) decision {
	for _, l := range r.Limits {
		if l.Quota == quotaName {
			return decision{r.Granted, l.Fits, l.WindowStart, l.WindowEnd, r.DecidedAt, l.RetryAfter, l.ResetAfter}
		}
	}
	return decision{r.Granted, r.Granted, r.WindowStart, r.WindowEnd, r.DecidedAt, r.RetryAfter, r.ResetAfter}
}

// checkDecisions checks outcomes of a fixed window of the given limit for
// one member: every decision's window [start, end) holds its instant, and
// its waits run from that instant to the window's end (a denial's
// RetryAfter is never Never: the next window has room); no window holds
// more than limit grants by decision instant. It returns the grants.
func checkDecisions(t *testing.T, what string, ds []decision, limit int) int {
	t.Helper()
	perWindow := map[time.Time]int{}
	granted, outside := 0, 0
	for i, d := range ds {
		if d.at.Before(d.start) || !d.at.Before(d.end) {
			outside++
			if outside <= 3 {
				t.Errorf("%s: decision %d at %s outside its window [%s, %s) (retry %s, reset %s)", what, i,
					d.at.Format(time.RFC3339Nano), d.start.Format(time.RFC3339Nano), d.end.Format(time.RFC3339Nano), d.retryAfter, d.resetAft)
			}
			continue
		}
		require.Equal(t, d.end.Sub(d.at), d.resetAft, "%s: decision %d: ResetAfter runs to the window's end", what, i)
		if d.granted {
			granted++
			perWindow[d.start]++
		}
		if d.fits {
			require.Zero(t, d.retryAfter, "%s: decision %d", what, i)
		} else {
			require.Equal(t, d.end.Sub(d.at), d.retryAfter, "%s: decision %d: a denial's RetryAfter runs to the window's end", what, i)
		}
	}
	require.Zero(t, outside, "%s: decisions outside their window, of %d", what, len(ds))
	for w, n := range perWindow {
		require.LessOrEqual(t, n, limit, "%s: grants decided in the window starting %s", what, w.Format(time.RFC3339Nano))
	}
	return granted
}

// checkCounters checks that no stored counter of quota exceeds limit and
// that the counters sum to the grants reported.
func (b *testBundle) checkCounters(t *testing.T, what, quotaName string, limit, granted int) {
	t.Helper()
	var most, sum int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(max(used), 0), coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = $1`,
		quotaName).Scan(&most, &sum))
	require.LessOrEqual(t, most, int64(limit), "%s: a stored counter above the limit", what)
	require.Equal(t, int64(granted), sum, "%s: the counters hold the grants reported", what)
}

// With pgquota.clock() moving 300 us at each reading and a fixed window of
// 1 ms with limit 1 (and, in grants against several quotas, a 3 ms window
// of limit 2 beside it), every path that decides fixed windows decides each
// grant at an instant its window holds: Grant, Grant with Quotas,
// GrantBatch, Config.Coalesce, Config.GroupCommit, and the SQL functions
// that decide (pgquota.grant_row, grant_limits_row and grant_limits_batch,
// whose waits are in microseconds, so the test compares them exactly; the
// public pgquota.grant and grant_limits return the same decisions with
// their waits in milliseconds: sql_durations_in_milliseconds_test.go).
func TestFixedWindowHoldsDecisionInstantSteppingClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	paths := []struct {
		name string
		run  func(t *testing.T, b *testBundle) []quota.GrantResult
	}{
		{"Grant", func(t *testing.T, b *testBundle) []quota.GrantResult {
			var out []quota.GrantResult
			for range 200 {
				r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "f1", Member: "m", Amount: 1})
				require.NoError(t, err)
				out = append(out, r)
			}
			return out
		}},
		{"Grant with Quotas", func(t *testing.T, b *testBundle) []quota.GrantResult {
			var out []quota.GrantResult
			for range 200 {
				r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quotas: []string{"f3", "f1"}, Member: "m", Amount: 1})
				require.NoError(t, err)
				out = append(out, r)
			}
			return out
		}},
		{"GrantBatch", func(t *testing.T, b *testBundle) []quota.GrantResult {
			var out []quota.GrantResult
			for range 4 {
				reqs := make([]quota.GrantRequest, 50)
				for i := range reqs {
					reqs[i] = quota.GrantRequest{Quota: "f1", Member: "m", Amount: 1}
					if i%2 == 1 {
						reqs[i] = quota.GrantRequest{Quotas: []string{"f1", "f3"}, Member: "m", Amount: 1}
					}
				}
				outs, err := b.client.GrantBatch(b.ctx, reqs)
				require.NoError(t, err)
				for _, o := range outs {
					require.NoError(t, o.Err)
					out = append(out, o.GrantResult)
				}
			}
			return out
		}},
		{"Coalesce", func(t *testing.T, b *testBundle) []quota.GrantResult {
			return concurrentGrants(t, b, b.coalescing(t, quota.Config{}), 200)
		}},
		{"GroupCommit", func(t *testing.T, b *testBundle) []quota.GrantResult {
			return concurrentGrants(t, b, b.grouping(t, quota.Config{}, 0, nil), 200)
		}},
	}
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 8)
			b.define(t, quota.Definition{Name: "f1", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: time.Millisecond})
			b.define(t, quota.Definition{Name: "f3", Window: quota.WindowFixed, DefaultLimit: ptr(int64(2)), Period: 3 * time.Millisecond})
			b.stepClock(t, start, 300*time.Microsecond)
			results := path.run(t, b)
			ds := make([]decision, len(results))
			ds3 := make([]decision, 0, len(results))
			for i, r := range results {
				ds[i] = decisionOf(r, "f1")
				if len(r.Limits) == 2 {
					ds3 = append(ds3, decisionOf(r, "f3"))
				}
			}
			granted := checkDecisions(t, path.name+" f1", ds, 1)
			require.Positive(t, granted)
			b.checkCounters(t, path.name, "f1", 1, granted)
			if len(ds3) > 0 {
				g3 := checkDecisions(t, path.name+" f3", ds3, 2)
				b.checkCounters(t, path.name, "f3", 2, g3)
			}
			t.Logf("%s: %d of %d granted", path.name, granted, len(results))
		})
	}

	t.Run("SQL functions", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 4)
		b.define(t, quota.Definition{Name: "f1", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: time.Millisecond})
		b.define(t, quota.Definition{Name: "f3", Window: quota.WindowFixed, DefaultLimit: ptr(int64(2)), Period: 3 * time.Millisecond})
		b.stepClock(t, start, 300*time.Microsecond)
		for _, c := range []struct{ name, member, sql string }{
			{"pgquota.grant_row", "a", `SELECT g.granted, g.granted, g.window_start, g.window_end, g.decided_at, g.retry_after_us, g.reset_after_us
				FROM generate_series(1, 500) s(i), LATERAL pgquota.grant_row('f1', 'a', 1 + 0 * s.i) g ORDER BY s.i`},
			{"pgquota.grant_limits_row", "b", `SELECT g.granted, g.fits, g.window_start, g.window_end, g.decided_at, g.retry_after_us, g.reset_after_us
				FROM generate_series(1, 500) s(i), LATERAL pgquota.grant_limits_row(ARRAY['f3', 'f1'], 'b', 1 + 0 * s.i, NULL) g
				WHERE g.quota_name = 'f1' ORDER BY s.i`},
			{"pgquota.grant_limits_batch", "c", `SELECT g.granted, g.fits, g.window_start, g.window_end, g.decided_at, g.retry_after_us, g.reset_after_us
				FROM generate_series(1, 5) s(i),
				     LATERAL pgquota.grant_limits_batch(
				         array_fill('f1'::text, ARRAY[100]), array(SELECT generate_series(1, 100)), array_fill(1, ARRAY[100]),
				         array_fill('c'::text, ARRAY[100]), array_fill(1 + 0 * s.i::bigint, ARRAY[100]), array_fill(-1::bigint, ARRAY[100])) g
				ORDER BY s.i, g.req_index`},
		} {
			rows, err := b.pool.Query(b.ctx, c.sql)
			require.NoError(t, err)
			ds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (decision, error) {
				var d decision
				var retry, reset int64
				err := row.Scan(&d.granted, &d.fits, &d.start, &d.end, &d.at, &retry, &reset)
				d.retryAfter, d.resetAft = usWait(retry), usWait(reset)
				return d, err
			})
			require.NoError(t, err)
			granted := checkDecisions(t, c.name, ds, 1)
			var sum int64
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = 'f1' AND member = $1`,
				c.member).Scan(&sum))
			require.Equal(t, int64(granted), sum, c.name)
			t.Logf("%s: %d of %d granted", c.name, granted, len(ds))
		}
	})
}

// usWait is a wait in microseconds as quota reports it (-1: Never).
func usWait(us int64) time.Duration {
	if us < 0 {
		return quota.Never
	}
	return time.Duration(us) * time.Microsecond
}

// concurrentGrants runs n concurrent Grant calls of 1 unit of fixed window
// f1 for member m through c.
func concurrentGrants(t *testing.T, b *testBundle, c *quota.Client, n int) []quota.GrantResult {
	t.Helper()
	out := make([]quota.GrantResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "f1", Member: "m", Amount: 1})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
			}
			out[i] = r
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	return out
}

// With the real database clock: 3,000 grants of a fixed window of limit 1
// (1 ms, and 10 ms) in one statement, through pgquota.grant_limits_row,
// pgquota.grant_row and pgquota.grant_limits_batch, each decided at an instant
// its window holds, and no window holding more than one grant by decision
// instant; and 1,000 Grant calls (one after another, in batches of
// GrantBatch, concurrent through coalescing and group commit) on a 1 ms
// window, likewise.
func TestFixedWindowHoldsDecisionInstantRealClock(t *testing.T) {
	t.Parallel()
	t.Run("one statement", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 2)
		b.define(t, quota.Definition{Name: "f1", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: time.Millisecond})
		b.define(t, quota.Definition{Name: "f10", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: 10 * time.Millisecond})
		for _, c := range []struct{ fn, sql string }{
			{"pgquota.grant_limits_row", `SELECT g.granted, g.fits, g.window_start, g.window_end, g.decided_at, g.retry_after_us, g.reset_after_us
				FROM generate_series(1, 3000) s(i), LATERAL pgquota.grant_limits_row(ARRAY[$1::text], $2, 1 + 0 * s.i, NULL) g ORDER BY s.i`},
			{"pgquota.grant_row", `SELECT g.granted, g.granted, g.window_start, g.window_end, g.decided_at, g.retry_after_us, g.reset_after_us
				FROM generate_series(1, 3000) s(i), LATERAL pgquota.grant_row($1::text, $2, 1 + 0 * s.i) g ORDER BY s.i`},
			{"pgquota.grant_limits_batch", `SELECT g.granted, g.fits, g.window_start, g.window_end, g.decided_at, g.retry_after_us, g.reset_after_us
				FROM generate_series(1, 30) s(i),
				     LATERAL pgquota.grant_limits_batch(
				         array_fill($1::text, ARRAY[100]), array(SELECT generate_series(1, 100)), array_fill(1, ARRAY[100]),
				         array_fill($2::text, ARRAY[100]), array_fill(1 + 0 * s.i::bigint, ARRAY[100]), array_fill(-1::bigint, ARRAY[100])) g
				ORDER BY s.i, g.req_index`},
		} {
			for _, q := range []string{"f1", "f10"} {
				rows, err := b.pool.Query(b.ctx, c.sql, q, c.fn)
				require.NoError(t, err)
				ds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (decision, error) {
					var d decision
					var retry, reset int64
					err := row.Scan(&d.granted, &d.fits, &d.start, &d.end, &d.at, &retry, &reset)
					d.retryAfter, d.resetAft = usWait(retry), usWait(reset)
					return d, err
				})
				require.NoError(t, err)
				granted := checkDecisions(t, c.fn+" "+q, ds, 1)
				var sum, most int64
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(used), 0), coalesce(max(used), 0) FROM pgquota.usage
					WHERE quota_name = $1 AND member = $2`, q, c.fn).Scan(&sum, &most))
				require.Equal(t, int64(granted), sum, "%s %s: the counters hold the grants reported", c.fn, q)
				require.LessOrEqual(t, most, int64(1))
				t.Logf("%s %s: %d of %d granted", c.fn, q, granted, len(ds))
			}
		}
	})
	t.Run("Grant and GrantBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 2)
		b.define(t, quota.Definition{Name: "f1", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: time.Millisecond})
		var results []quota.GrantResult
		for range 500 {
			r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "f1", Member: "m", Amount: 1})
			require.NoError(t, err)
			results = append(results, r)
		}
		for range 5 {
			reqs := make([]quota.GrantRequest, 100)
			for i := range reqs {
				reqs[i] = quota.GrantRequest{Quota: "f1", Member: "m", Amount: 1}
			}
			outs, err := b.client.GrantBatch(b.ctx, reqs)
			require.NoError(t, err)
			for _, o := range outs {
				require.NoError(t, o.Err)
				results = append(results, o.GrantResult)
			}
		}
		ds := make([]decision, len(results))
		for i, r := range results {
			ds[i] = decisionOf(r, "f1")
		}
		granted := checkDecisions(t, "Grant and GrantBatch", ds, 1)
		b.checkCounters(t, "Grant and GrantBatch", "f1", 1, granted)
		t.Logf("Grant and GrantBatch: %d of %d granted", granted, len(results))
	})
	for _, path := range []string{"Coalesce", "GroupCommit"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 8)
			b.define(t, quota.Definition{Name: "f1", Window: quota.WindowFixed, DefaultLimit: ptr(int64(1)), Period: time.Millisecond})
			c := b.coalescing(t, quota.Config{})
			if path == "GroupCommit" {
				c = b.grouping(t, quota.Config{}, 0, nil)
			}
			var results []quota.GrantResult
			for range 5 {
				results = append(results, concurrentGrants(t, b, c, 200)...)
			}
			ds := make([]decision, len(results))
			for i, r := range results {
				ds[i] = decisionOf(r, "f1")
			}
			granted := checkDecisions(t, path, ds, 1)
			b.checkCounters(t, path, "f1", 1, granted)
			t.Logf("%s: %d of %d granted", path, granted, len(results))
		})
	}
}
