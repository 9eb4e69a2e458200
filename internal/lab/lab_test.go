package lab_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/lab"
	"github.com/pgquota/pgquota/internal/pgtest"
)

func byName(t *testing.T, rep *lab.Report, name string) lab.StrategyReport {
	t.Helper()
	for _, s := range rep.Strategies {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no strategy %s in the report", name)
	return lab.StrategyReport{}
}

// TestLabCounting runs the lab with small settings: the conditional grant
// and the fenced lock hand out exactly the limit in every run, the fenced
// lock rejecting the writes of the holders paused past the TTL, and the
// broken strategies leak under the injected think time and pauses. The
// leaks and the exact counts depend on the pauses landing as planned, so
// the scenario is tried up to 3 times (retryScenario; the failure shows
// every run of every attempt); no safe strategy may exceed the limit in
// any attempt.
func TestLabCounting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	cfg := lab.DefaultConfig()
	cfg.Requests = 8
	cfg.Limit = 2
	cfg.Runs = 2
	// The lock services have a test of their own (lab_lock_services_leak_unless_fenced_test.go).
	cfg.Strategies = slices.DeleteFunc(lab.Names(), func(n string) bool { return strings.HasPrefix(n, "zookeeper") || strings.HasPrefix(n, "etcd") })
	pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
	retryScenario(t, 3, func(a *attempt) {
		rep, err := lab.Run(ctx, admin, cfg)
		require.NoError(t, err)
		a.saw(rep)
		requireNeverAboveLimit(t, rep, cfg.Limit)
		require.Empty(a, rep.Violations)
		require.Equal(a, 8, rep.Requests)
		require.Equal(a, "off", rep.SynchronousCommit)
		require.NotEmpty(a, rep.Database)

		cond := byName(t, rep, "conditional")
		require.Equal(a, lab.StatusOK, cond.Status)
		require.Len(a, cond.Runs, 2)
		for _, r := range cond.Runs {
			require.Equal(a, int64(2), r.Granted)
			require.Equal(a, int64(6), r.Denied)
			require.Zero(a, r.Leaked)
			require.Zero(a, r.Errors)
			require.Equal(a, int64(2), r.Counter)
		}
		require.Equal(a, 2, cond.ExactRuns)

		noLock := byName(t, rep, "no-lock")
		for _, r := range noLock.Runs {
			require.Zero(a, r.Errors, r.FirstError)
			require.Positive(a, r.Leaked, "no-lock must leak under a %s think time", cfg.Think)
			require.Equal(a, r.Granted-2, r.Leaked)
			require.Equal(a, int64(8), r.Granted+r.Denied)
			// Absolute writes: the counter claims far fewer than were granted.
			require.Less(a, r.Counter, r.Granted)
		}
		require.Equal(a, 2, noLock.LeakedRuns)

		naive := byName(t, rep, "naive-lock")
		for _, r := range naive.Runs {
			require.Zero(a, r.Errors, r.FirstError)
			require.Positive(a, r.Leaked, "naive-lock must leak when holders pause past the TTL")
		}

		// Redis is optional: unavailable is fine, but when it runs, it leaks.
		redis := byName(t, rep, "redis-lock")
		if redis.Status == lab.StatusOK {
			require.Equal(a, 2, redis.LeakedRuns)
		} else {
			require.Equal(a, lab.StatusUnavailable, redis.Status)
		}

		fenced := byName(t, rep, "fenced")
		require.Equal(a, lab.StatusOK, fenced.Status)
		require.True(a, fenced.Safe)
		require.Contains(a, fenced.Injected, "TTL 100ms")
		require.Contains(a, fenced.Injected, "pause 200ms (> TTL")
		require.Len(a, fenced.Runs, 2)
		for _, r := range fenced.Runs {
			require.Zero(a, r.Errors, r.FirstError)
			require.Equal(a, int64(2), r.Granted)
			require.Equal(a, int64(6), r.Denied)
			require.Zero(a, r.Leaked)
			require.Equal(a, int64(2), r.Counter)
			// Every paused holder wakes after its lease ended (pause > TTL):
			// its write is rejected. A slow statement may add more.
			require.GreaterOrEqual(a, r.StaleRejected, int64(cfg.Paused))
		}
		require.Equal(a, 2, fenced.ExactRuns)
		require.Zero(a, fenced.LeakedRuns)

		require.NotNil(a, cond.Summary)
		require.Equal(a, lab.Stat{Min: 2, Median: 2, Max: 2}, cond.Summary.Granted)
	})
}

// TestLabFencedWithoutPauses: with no pause and a TTL far above the think
// time, no write is stale; the limit still holds.
func TestLabFencedWithoutPauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	cfg := lab.DefaultConfig()
	cfg.Requests = 6
	cfg.Limit = 3
	cfg.Think = 10 * time.Millisecond
	cfg.TTL = 5 * time.Second
	cfg.Pause = 0
	cfg.Strategies = []string{"fenced"}
	pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
	rep, err := lab.Run(ctx, admin, cfg)
	require.NoError(t, err)
	require.Empty(t, rep.Violations)
	require.Len(t, rep.Strategies, 1)
	r := byName(t, rep, "fenced").Runs[0]
	require.Zero(t, r.Errors, r.FirstError)
	require.Equal(t, int64(3), r.Granted)
	require.Equal(t, int64(3), r.Counter)
	require.Zero(t, r.StaleRejected)
	require.NotContains(t, byName(t, rep, "fenced").Injected, "pause")
}

// TestStrategies: every call makes new instances, so concurrent labs share
// no state, in the order the output lists them.
func TestStrategies(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"no-lock", "naive-lock", "redis-lock", "redis-naive", "redlock", "conditional", "fenced", "redlock-fenced",
		"zookeeper", "zookeeper-fenced", "etcd", "etcd-fenced"}, lab.Names())
	require.NotSame(t, lab.Strategies()[2], lab.Strategies()[2])
	require.NotSame(t, lab.Strategies()[4], lab.Strategies()[4])
	for _, s := range lab.Strategies() {
		require.Equal(t, s.Name() == "conditional" || strings.HasSuffix(s.Name(), "fenced"), s.Safe(), s.Name())
	}
}

// TestLabRedisUnavailable: no Redis at the URL is "unavailable", not a
// failure, and only the strategies asked for run.
func TestLabRedisUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	cfg := lab.DefaultConfig()
	cfg.Requests = 4
	cfg.RedisURL = "redis://127.0.0.1:1"
	cfg.Strategies = []string{"redis-lock", "conditional"}
	cfg.Pause = 0
	pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
	rep, err := lab.Run(ctx, admin, cfg)
	require.NoError(t, err)
	require.Len(t, rep.Strategies, 2)
	redis := byName(t, rep, "redis-lock")
	require.Equal(t, lab.StatusUnavailable, redis.Status)
	require.Contains(t, redis.Reason, "redis://127.0.0.1:1")
	require.Empty(t, redis.Runs)
	cond := byName(t, rep, "conditional")
	require.Equal(t, int64(1), cond.Runs[0].Granted)
	require.Less(t, cond.Runs[0].WallMS, float64(5*time.Second/time.Millisecond))
}

func TestLabConfigValidate(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*lab.Config){
		"requests": func(c *lab.Config) { c.Requests = 0 },
		"limit":    func(c *lab.Config) { c.Limit = -1 },
		"think":    func(c *lab.Config) { c.Think = -time.Second },
		"ttl":      func(c *lab.Config) { c.TTL = 0 },
		"pause":    func(c *lab.Config) { c.Pause = -1 },
		"paused":   func(c *lab.Config) { c.Paused = -1 },
		"runs":     func(c *lab.Config) { c.Runs = 0 },
		"strategy": func(c *lab.Config) { c.Strategies = []string{"nope"} },
	} {
		cfg := lab.DefaultConfig()
		mod(&cfg)
		err := cfg.Validate()
		require.ErrorContains(t, err, name, name)
	}
	require.NoError(t, lab.DefaultConfig().Validate())
}
