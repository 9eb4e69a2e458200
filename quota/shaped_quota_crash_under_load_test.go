package quota_test

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// shapedGrant is one grant reported granted by a rate, fixed-window or
// rolling-window quota.
type shapedGrant struct {
	at     time.Time // GrantResult.DecidedAt
	amount int64
	window time.Time // GrantResult.WindowStart (fixed windows)
}

// shapedLoad is what the load of one quota kind reported.
type shapedLoad struct {
	mu           sync.Mutex
	granted      []shapedGrant
	denied       int
	unknownUnits int64 // units of the calls whose outcome is unknown
}

func (s *shapedLoad) grants() []shapedGrant {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]shapedGrant(nil), s.granted...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// TestShapedQuotaGrantsSurviveImmediateShutdownUnderLoad proves, for the
// rate (GCRA), fixed-window and rolling-window quotas, that every grant
// reported granted survives an immediate shutdown that hits 18 goroutines
// granting through two Clients (replicas), and that no limit is exceeded
// across the crash. Each round crashes the server mid-load, restarts it,
// checks the state the server recovered before any new call (the TAT, the
// window counters, the rolling stamps account for every reported grant,
// and for at most the calls whose outcome is unknown), grants on, and
// checks the whole run: the GCRA bound for the instants the database
// recorded, no fixed window over its limit, no interval of the rolling
// window's length over its limit. Every error is either a clear error
// before sending or wraps ErrOutcomeUnknown (the README's promise). The
// rounds alternate between synchronous_commit on and off for the role
// (grant_limits raises it for its transaction: pgquota.durable_commit).
func TestShapedQuotaGrantsSurviveImmediateShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cl, targets := newCrashCluster(t, "shapedcrash")
	const (
		rateLimit   = 50 // per second: an emission interval of 20 ms
		rateBurst   = 25
		emission    = int64(time.Second/time.Microsecond) / rateLimit
		fixedLimit  = 6
		fixedPeriod = 300 * time.Millisecond
		rollLimit   = 12
		rollPeriod  = time.Second
		workers     = 18
	)
	for round := range crashRounds(t, 2) {
		tg := targets[round%len(targets)]
		name := func(s string) string { return fmt.Sprintf("%s-%d", s, round) }
		rate, fixed, roll := name("rate"), name("fixed"), name("roll")
		admin, closeAdmin := crashClient(t, cl.URL(tg.Database))
		for _, d := range []quota.Definition{
			{Name: rate, Window: quota.WindowRate, DefaultLimit: ptr[int64](rateLimit), Period: time.Second, Burst: rateBurst},
			{Name: fixed, Window: quota.WindowFixed, DefaultLimit: ptr[int64](fixedLimit), Period: fixedPeriod},
			{Name: roll, Window: quota.WindowRolling, DefaultLimit: ptr[int64](rollLimit), Period: rollPeriod},
		} {
			_, err := admin.DefineQuota(ctx, d)
			require.NoError(t, err)
		}
		closeAdmin()
		cl.Exec(tg.Database, "CHECKPOINT")

		var clients []*quota.Client
		var closers []func()
		for range 2 {
			c, closePool := crashLoadPool(t, tg.URL, 8, nil)
			requireSynchronousCommit(t, c, tg)
			clients = append(clients, c)
			closers = append(closers, closePool)
		}
		quotas := []string{rate, fixed, roll}
		loads := map[string]*shapedLoad{rate: {}, fixed: {}, roll: {}}
		load := newCrashLoad(t)
		load.Start(workers, func(w int) {
			q := quotas[w%3]
			amount := int64(1)
			if q == roll {
				amount = int64(1 + w%2)
			}
			res, err := clients[(w/3)%2].Grant(ctx, quota.GrantRequest{Quota: q, Member: "m", Amount: amount})
			s := loads[q]
			if err != nil {
				if load.Failed(fmt.Sprintf("grant of %d on %s", amount, q), err) {
					s.mu.Lock()
					s.unknownUnits += amount
					s.mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if res.Granted {
				s.granted = append(s.granted, shapedGrant{res.DecidedAt, amount, res.WindowStart})
			} else {
				s.denied++
			}
		})
		time.Sleep(1200 * time.Millisecond)
		load.Crash(cl)

		// The state the server recovered, before any new call.
		check, closeCheck := crashClient(t, cl.URL(tg.Database))
		before := map[string]int{}
		for _, q := range quotas {
			before[q] = len(loads[q].grants())
			require.Positive(t, before[q], "round %d: %s granted nothing before the crash", round, q)
		}
		checkRateState(t, check, rate, loads[rate], emission, "after the restart")
		checkFixedState(t, check, fixed, loads[fixed], fixedLimit, "after the restart")
		extra := checkRollingState(t, check, roll, loads[roll], rollPeriod, "after the restart")
		closeCheck()

		load.Resume()
		time.Sleep(1200 * time.Millisecond)
		load.Stop()
		for _, c := range closers {
			c()
		}

		check, closeCheck = crashClient(t, cl.URL(tg.Database))
		checkRateState(t, check, rate, loads[rate], emission, "at the end")
		checkRateBound(t, loads[rate].grants(), emission, rateBurst)
		checkFixedState(t, check, fixed, loads[fixed], fixedLimit, "at the end")
		checkRollingState(t, check, roll, loads[roll], rollPeriod, "at the end")
		checkRollingBound(t, append(loads[roll].grants(), extra...), rollPeriod, rollLimit)
		closeCheck()
		unknown, preSend := load.ErrorCounts()
		require.Positive(t, unknown+preSend, "round %d: no call noticed the crash", round)
		for _, q := range quotas {
			s := loads[q]
			require.Greater(t, len(s.grants()), before[q], "round %d: %s granted nothing after the restart", round, q)
			t.Logf("round %d (%s), %s: %d granted (%d before the crash), %d denied, %d units of unknown outcome",
				round, tg.What, q, len(s.grants()), before[q], s.denied, s.unknownUnits)
		}
		t.Logf("round %d: crash and restart took %s; %d errors of unknown outcome, %d clear errors before sending",
			round, load.CrashDur.Round(time.Millisecond), unknown, preSend)
	}
}

// checkRateState checks the stored TAT of a rate quota (member "m") against
// the grants reported granted, replayed in the order of their instants:
// each step sets TAT to max(TAT, t) + amount*T. An extra grant (one whose
// outcome was unknown and that committed) moves the result by at most its
// amount*T, so the stored TAT lies between the replay and the replay plus
// the unknown units times T; a lost grant leaves it below the replay.
func checkRateState(t *testing.T, c *quota.Client, name string, s *shapedLoad, emission int64, when string) {
	t.Helper()
	var tat int64
	var whole bool
	require.NoError(t, c.Pool().QueryRow(t.Context(),
		`SELECT tat_us::bigint, tat_us = trunc(tat_us) FROM pgquota.rate_state WHERE quota_name = $1 AND member = 'm'`, name).Scan(&tat, &whole))
	require.True(t, whole, "%s: the TAT moves in whole emission intervals of %d us", name, emission)
	var replay int64
	for _, g := range s.grants() {
		replay = max(replay, g.at.UnixMicro()) + g.amount*emission
	}
	s.mu.Lock()
	unknown := s.unknownUnits
	s.mu.Unlock()
	require.GreaterOrEqual(t, tat, replay, "%s %s: the stored TAT is %d us behind the grants reported granted (%d us, %d intervals lost)",
		name, when, replay-tat, replay-tat, (replay-tat+emission-1)/emission)
	require.LessOrEqual(t, tat, replay+unknown*emission, "%s %s: the stored TAT is ahead of the reported grants by more than the %d units of unknown outcome", name, when, unknown)
}

// checkRateBound checks the reported grants of a rate against GCRA: each
// fits the TAT that the grants before it give (a lower bound of the real
// one), and the units of the whole run stay within burst plus the span over
// the emission interval (plus the first).
func checkRateBound(t *testing.T, grants []shapedGrant, emission, burst int64) {
	t.Helper()
	var tat, units int64
	for i, g := range grants {
		now := g.at.UnixMicro()
		base := max(tat, now)
		require.LessOrEqual(t, base+g.amount*emission-burst*emission, now, "grant %d at %s does not fit GCRA", i, g.at.Format(time.RFC3339Nano))
		tat = base + g.amount*emission
		units += g.amount
	}
	span := grants[len(grants)-1].at.Sub(grants[0].at).Microseconds()
	require.LessOrEqual(t, units, burst+span/emission+1, "units granted over %d us", span)
}

// checkFixedState checks the counters of a fixed-window quota (member "m"):
// each window's counter holds every reported grant of that window, is at
// most the limit, and all counters hold at most the units of unknown
// outcome beyond the reported ones.
func checkFixedState(t *testing.T, c *quota.Client, name string, s *shapedLoad, limit int64, when string) {
	t.Helper()
	rows, err := c.Pool().Query(t.Context(), `SELECT window_start, used FROM pgquota.usage WHERE quota_name = $1 AND member = 'm'`, name)
	require.NoError(t, err)
	used := map[int64]int64{}
	var stored int64
	for rows.Next() {
		var start time.Time
		var u int64
		require.NoError(t, rows.Scan(&start, &u))
		used[start.UnixMicro()] = u
		stored += u
		require.LessOrEqual(t, u, limit, "%s %s: window %s over the limit", name, when, start.Format(time.RFC3339Nano))
	}
	require.NoError(t, rows.Err())
	reported := map[int64]int64{}
	var sum int64
	for _, g := range s.grants() {
		reported[g.window.UnixMicro()] += g.amount
		sum += g.amount
	}
	for w, n := range reported {
		require.GreaterOrEqual(t, used[w], n, "%s %s: window %s lost reported grants", name, when, time.UnixMicro(w).UTC().Format(time.RFC3339Nano))
	}
	s.mu.Lock()
	unknown := s.unknownUnits
	s.mu.Unlock()
	require.LessOrEqual(t, stored, sum+unknown, "%s %s: counters hold %d units, %d were reported granted, %d of unknown outcome", name, when, stored, sum, unknown)
}

// checkRollingState checks the state row of a rolling-window quota (member
// "m"): it keeps the grants of one period before its newest entry, so every
// reported grant newer than that must be among its entries (instant and
// units), and at most the calls of unknown outcome may add entries. It
// returns the entries no reported grant accounts for (grants of unknown
// outcome that committed).
func checkRollingState(t *testing.T, c *quota.Client, name string, s *shapedLoad, period time.Duration, when string) []shapedGrant {
	t.Helper()
	var stamps []time.Time
	var units []int64
	require.NoError(t, c.Pool().QueryRow(t.Context(),
		`SELECT stamps, units FROM pgquota.rolling_usage WHERE quota_name = $1 AND member = 'm'`, name).Scan(&stamps, &units))
	require.NotEmpty(t, stamps, "%s %s: no entries", name, when)
	newest := stamps[len(stamps)-1]
	type entry struct{ at, units int64 }
	kept := map[entry]int{}
	for i := range stamps {
		kept[entry{stamps[i].UnixMicro(), units[i]}]++
	}
	for _, g := range s.grants() {
		if newest.Sub(g.at) >= period {
			continue
		}
		e := entry{g.at.UnixMicro(), g.amount}
		require.Positive(t, kept[e], "%s %s: the grant of %d at %s is not in the state (newest entry %s)",
			name, when, g.amount, g.at.Format(time.RFC3339Nano), newest.Format(time.RFC3339Nano))
		kept[e]--
	}
	var extra []shapedGrant
	for e, n := range kept {
		for range n {
			extra = append(extra, shapedGrant{at: time.UnixMicro(e.at), amount: e.units})
		}
	}
	s.mu.Lock()
	unknown := s.unknownUnits
	s.mu.Unlock()
	var extraUnits int64
	for _, g := range extra {
		extraUnits += g.amount
	}
	require.LessOrEqual(t, extraUnits, unknown, "%s %s: %d units in the state that no reported grant accounts for, %d of unknown outcome", name, when, extraUnits, unknown)
	return extra
}

// checkRollingBound checks that no half-open interval of the period holds
// more than limit units of grants (the maximum is reached at an interval
// that starts at a grant).
func checkRollingBound(t *testing.T, grants []shapedGrant, period time.Duration, limit int64) {
	t.Helper()
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
	for i, g := range grants {
		var sum int64
		for _, p := range grants[i:] {
			if p.at.Sub(g.at) >= period {
				break
			}
			sum += p.amount
		}
		require.LessOrEqual(t, sum, limit, "units in [%s, +%s)", g.at.Format(time.RFC3339Nano), period)
	}
}
