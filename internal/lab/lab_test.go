package lab_test

import (
	"context"
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
// hands out exactly the limit in every run, and the broken strategies leak
// under the injected think time and pauses.
func TestLabCounting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	cfg := lab.DefaultConfig()
	cfg.Requests = 8
	cfg.Limit = 2
	cfg.Runs = 2
	rep, err := lab.Run(ctx, admin, cfg)
	require.NoError(t, err)
	require.Empty(t, rep.Violations)
	require.Equal(t, 8, rep.Requests)
	require.NotEmpty(t, rep.Database)

	cond := byName(t, rep, "conditional")
	require.Equal(t, lab.StatusOK, cond.Status)
	require.Len(t, cond.Runs, 2)
	for _, r := range cond.Runs {
		require.Equal(t, int64(2), r.Granted)
		require.Equal(t, int64(6), r.Denied)
		require.Zero(t, r.Leaked)
		require.Zero(t, r.Errors)
		require.Equal(t, int64(2), r.Counter)
	}
	require.Equal(t, 2, cond.ExactRuns)

	noLock := byName(t, rep, "no-lock")
	for _, r := range noLock.Runs {
		require.Zero(t, r.Errors, r.FirstError)
		require.Positive(t, r.Leaked, "no-lock must leak under a %s think time", cfg.Think)
		require.Equal(t, r.Granted-2, r.Leaked)
		require.Equal(t, int64(8), r.Granted+r.Denied)
		// Absolute writes: the counter claims far fewer than were granted.
		require.Less(t, r.Counter, r.Granted)
	}
	require.Equal(t, 2, noLock.LeakedRuns)

	naive := byName(t, rep, "naive-lock")
	for _, r := range naive.Runs {
		require.Zero(t, r.Errors, r.FirstError)
		require.Positive(t, r.Leaked, "naive-lock must leak when holders pause past the TTL")
	}

	// Redis is optional: unavailable is fine, but when it runs, it leaks.
	redis := byName(t, rep, "redis-lock")
	if redis.Status == lab.StatusOK {
		require.Equal(t, 2, redis.LeakedRuns)
	} else {
		require.Equal(t, lab.StatusUnavailable, redis.Status)
	}

	fenced := byName(t, rep, "fenced")
	require.Equal(t, lab.StatusPending, fenced.Status)

	require.NotNil(t, cond.Summary)
	require.Equal(t, lab.Stat{Min: 2, Median: 2, Max: 2}, cond.Summary.Granted)
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
