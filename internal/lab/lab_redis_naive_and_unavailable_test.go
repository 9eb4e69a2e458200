package lab_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/lab"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// The article's non-atomic Redis lock, 20 concurrent requests against a
// limit of 1, on a redis-server the lab starts: the requests that GET the
// key before the first SET lands all believe they hold the lock at once,
// all read 0 and all write 1. More than the limit is granted in every run,
// the counter says 1, and the article's figure stands beside ours.
func TestLabRedisNaiveLeaksLikeTheArticle(t *testing.T) {
	t.Parallel()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	cfg := lab.DefaultConfig()
	cfg.Runs = 2
	cfg.Strategies = []string{"redis-naive", "conditional"}
	pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
	rep, err := lab.Run(context.Background(), admin, cfg)
	require.NoError(t, err)
	require.Empty(t, rep.Violations)
	naive := byName(t, rep, "redis-naive")
	require.Equal(t, lab.StatusOK, naive.Status, "redis-server must start for this test (Debian package redis-server): %s", naive.Reason)
	require.False(t, naive.Safe)
	require.Equal(t, "leaked 9 of 20", naive.Article)
	require.Contains(t, naive.Injected, "GET the key, if free wait 10ms (a network round trip) and SET it")
	for i, r := range naive.Runs {
		require.Zero(t, r.Errors, r.FirstError)
		require.Greater(t, r.Granted, int64(1), "run %d", i+1)
		require.Equal(t, r.Granted-1, r.Leaked)
		require.Equal(t, int64(20), r.Granted+r.Denied)
		require.Equal(t, int64(1), r.Counter, "absolute writes of read+1")
		require.Equal(t, int64(20), r.Holds, "every request held the lock, in its belief, once")
		require.Positive(t, r.TwoHolders)
	}
	require.Equal(t, 2, naive.LeakedRuns)
	cond := byName(t, rep, "conditional")
	require.Equal(t, "granted 1 of 20", cond.Article)
	require.Zero(t, cond.Runs[0].Holds, "the conditional grant takes no lock")
	require.Contains(t, rep.ArticleNote, "HTTP/2")
}

// A redis-server that is not there, or that exits at once, makes the
// strategies that start their own servers unavailable (the lab goes on),
// with the reason: the binary's name, or the server's log tail.
func TestLabRedisServerThatCannotStartIsUnavailable(t *testing.T) {
	t.Parallel()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	failing := filepath.Join(t.TempDir(), "redis-server")
	require.NoError(t, os.WriteFile(failing, []byte("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR (from the test)'\nexit 1\n"), 0o755))
	for bin, want := range map[string]string{
		filepath.Join(t.TempDir(), "no-such-redis-server"): "not found",
		failing: "FATAL CONFIG FILE ERROR (from the test)",
	} {
		cfg := lab.DefaultConfig()
		cfg.Requests = 2
		cfg.Pause = 0
		cfg.RedisServer = bin
		cfg.Strategies = []string{"redis-naive", "redlock", "conditional", "redlock-fenced"}
		pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
		rep, err := lab.Run(context.Background(), admin, cfg)
		require.NoError(t, err, bin)
		for _, name := range []string{"redis-naive", "redlock", "redlock-fenced"} {
			s := byName(t, rep, name)
			require.Equal(t, lab.StatusUnavailable, s.Status, name)
			require.Contains(t, s.Reason, want, name)
			require.Empty(t, s.Runs)
		}
		require.Equal(t, int64(1), byName(t, rep, "conditional").Runs[0].Granted)
		require.Empty(t, rep.Violations)
	}
}
