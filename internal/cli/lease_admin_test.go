package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a command line in the background under ctx; wait returns its
// exit status.
func start(ctx context.Context, dbURL string, args ...string) (stdout, stderr *syncBuffer, wait func() int) {
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- cli.Run(ctx, append([]string{"--database-url", dbURL}, args...), stdout, stderr) }()
	return stdout, stderr, func() int { return <-done }
}

// processRuns reports whether process pid exists and is not a zombie.
func processRuns(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

// leaseTestClient is a lease client, a fence client and the pool they run on.
type leaseTestClient struct {
	*lease.Client
	fences *fence.Client
	pool   *pgxpool.Pool
}

func (c leaseTestClient) Pool() *pgxpool.Pool { return c.pool }

func leaseClient(t *testing.T, dbURL string) leaseTestClient {
	t.Helper()
	q, err := quota.New(pgtest.Connect(t, dbURL, 4), nil)
	require.NoError(t, err)
	c, err := lease.New(q)
	require.NoError(t, err)
	f, err := fence.New(q)
	require.NoError(t, err)
	return leaseTestClient{Client: c, fences: f, pool: q.Pool()}
}

func TestCLILeaseDo(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	c := leaseClient(t, dbURL)
	ctx := context.Background()

	t.Run("runs the command with the token", func(t *testing.T) {
		out := ok(t, dbURL, "lease", "do", "--name", "report", "--ttl", "10s", "--payload", "running",
			"--", "sh", "-c", `echo "$PGQUOTA_LEASE_NAME $PGQUOTA_LEASE_TOKEN"`)
		fields := strings.Fields(out)
		require.Len(t, fields, 2, out)
		require.Equal(t, "report", fields[0])
		token, err := strconv.ParseInt(fields[1], 10, 64)
		require.NoError(t, err)
		l, err := c.Get(ctx, "report")
		require.NoError(t, err)
		require.Equal(t, token, l.Token)
		require.False(t, l.Held, "released when the command exited")
	})

	t.Run("command fails", func(t *testing.T) {
		r := runDB(t, dbURL, "lease", "do", "--name", "fails", "--ttl", "10s", "--", "sh", "-c", "exit 7")
		requireError(t, r, cli.ExitError, "exited with status 7")
	})

	t.Run("held by another", func(t *testing.T) {
		_, err := c.Acquire(ctx, lease.AcquireRequest{Name: "busy", Holder: "other", TTL: time.Minute})
		require.NoError(t, err)
		r := runDB(t, dbURL, "lease", "do", "--name", "busy", "--ttl", "10s", "--", "sh", "-c", "echo ran")
		require.Equal(t, cli.ExitDenied, r.code, r.stderr)
		require.NotContains(t, r.stdout, "ran")
		require.Contains(t, r.stderr, `held by "other"`)
		r = runDB(t, dbURL, "lease", "do", "--name", "busy", "--ttl", "10s", "--json", "--", "sh", "-c", "echo ran")
		require.Equal(t, cli.ExitDenied, r.code, r.stderr)
		var out struct {
			Acquired *bool  `json:"acquired"`
			Holder   string `json:"holder"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		require.False(t, *out.Acquired)
		require.Equal(t, "other", out.Holder)
	})

	t.Run("lease lost stops the command", func(t *testing.T) {
		began := time.Now()
		// The command starts a child of its own, which must stop too.
		stdout, stderr, wait := start(ctx, dbURL, "lease", "do", "--name", "lost", "--ttl", "1s", "--", "sh", "-c", "sleep 30 & echo $!; wait")
		require.Eventually(t, func() bool {
			l, err := c.Get(ctx, "lost")
			return err == nil && l.Held
		}, 5*time.Second, 10*time.Millisecond)
		// An operator ends the lease and another holder takes it.
		_, err := c.Pool().Exec(ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() WHERE name = 'lost'`)
		require.NoError(t, err)
		_, err = c.Acquire(ctx, lease.AcquireRequest{Name: "lost", Holder: "thief", TTL: time.Minute})
		require.NoError(t, err)
		require.Equal(t, cli.ExitDenied, wait(), stderr.String())
		// The child sleeps 30 s: well below it, it was stopped (room for a
		// machine at a load of 20).
		require.Less(t, time.Since(began), 20*time.Second, "the command was stopped, not waited for")
		require.Contains(t, stderr.String(), "the command was stopped")
		require.Contains(t, stderr.String(), "lease lost")
		pid, err := strconv.Atoi(strings.TrimSpace(stdout.String()))
		require.NoError(t, err, stdout.String())
		require.Eventually(t, func() bool { return !processRuns(pid) }, 3*time.Second, 10*time.Millisecond,
			"the command's own child (pid %d) was stopped with its process group", pid)
	})

	t.Run("bad input", func(t *testing.T) {
		r := runDB(t, dbURL, "lease", "do", "--name", "x", "--ttl", "0s", "--", "true")
		requireError(t, r, cli.ExitUsage, "ttl")
		r = runDB(t, dbURL, "lease", "do", "--name", "x")
		require.Equal(t, cli.ExitUsage, r.code, "a command is required")
	})
}

func TestCLILeaseListPayloadReap(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	c := leaseClient(t, dbURL)
	ctx := context.Background()

	token := acquireJSON(t, dbURL, "--name", "job/a", "--ttl", "1m", "--payload", "step 1")
	acquireJSON(t, dbURL, "--name", "job/b", "--ttl", "1m")
	acquireJSON(t, dbURL, "--name", "other", "--ttl", "1m")

	out := ok(t, dbURL, "lease", "show", "--name", "job/a")
	require.Contains(t, out, "step 1")

	out = ok(t, dbURL, "lease", "set-payload", "--name", "job/a", "--token", fmt.Sprint(token), "--payload", "step 2", "--json")
	var shown struct {
		Payload string `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, "step 2", shown.Payload)
	r := runDB(t, dbURL, "lease", "set-payload", "--name", "job/a", "--token", fmt.Sprint(token+100), "--payload", "x")
	requireError(t, r, cli.ExitDenied, "lease lost")

	out = ok(t, dbURL, "lease", "list", "--prefix", "job/", "--json")
	var listed []struct {
		Name    string `json:"name"`
		Held    bool   `json:"held"`
		Payload string `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 2)
	require.Equal(t, "job/a", listed[0].Name)
	require.Equal(t, "step 2", listed[0].Payload)
	require.True(t, listed[1].Held)
	out = ok(t, dbURL, "lease", "list")
	require.Contains(t, out, "NAME")
	require.Contains(t, out, "other")

	// Release job/b and make it look two days old: reap deletes it alone.
	l, err := c.Get(ctx, "job/b")
	require.NoError(t, err)
	_, err = c.Release(ctx, lease.Lease{Name: "job/b", Token: l.Token})
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, `UPDATE pgquota.lease SET expires_at = expires_at - interval '48 hours' WHERE name = 'job/b'`)
	require.NoError(t, err)
	out = ok(t, dbURL, "lease", "reap", "--older-than", "24h", "--json")
	var reaped struct {
		Deleted int `json:"deleted"`
		Fences  int `json:"fences_deleted"`
		Leases  []struct {
			Name string `json:"name"`
		} `json:"leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &reaped), out)
	require.Equal(t, 1, reaped.Deleted)
	require.Zero(t, reaped.Fences)
	require.Equal(t, "job/b", reaped.Leases[0].Name)
	f, err := c.fences.State(ctx, "job/b")
	require.NoError(t, err)
	require.Equal(t, l.Token, f.Highest, "the fence row stays")

	requireError(t, runDB(t, dbURL, "lease", "reap", "--older-than", "-1h"), cli.ExitUsage, "older than")
	requireError(t, runDB(t, dbURL, "lease", "reap", "--older-than", "10s"), cli.ExitUsage, "older than")
	requireError(t, runDB(t, dbURL, "lease", "list", "--limit", "-1"), cli.ExitUsage, "limit")
}

func TestCLIElection(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	ctx := context.Background()

	r := runDB(t, dbURL, "election", "leader", "--name", "sched")
	require.Equal(t, cli.ExitDenied, r.code, r.stderr)
	require.Contains(t, r.stderr, "no leader")

	// The first campaigner leads until interrupted.
	cctx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	out1, err1, wait1 := start(cctx, dbURL, "election", "campaign", "--name", "sched", "--ttl", "5s", "--value", "10.0.0.1:80", "--json")
	require.Eventually(t, func() bool { return strings.Contains(out1.String(), `"acquired": true`) }, 5*time.Second, 10*time.Millisecond, err1.String())
	var first struct {
		Token int64 `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out1.String()), &first))

	out := ok(t, dbURL, "election", "leader", "--name", "sched", "--json")
	var leader struct {
		Token   int64  `json:"token"`
		Payload string `json:"payload"`
		Held    bool   `json:"held"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &leader))
	require.Equal(t, first.Token, leader.Token)
	require.Equal(t, "10.0.0.1:80", leader.Payload)
	require.True(t, leader.Held)

	// A watcher follows the changes.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wout, _, wwait := start(wctx, dbURL, "election", "leader", "--name", "sched", "--watch", "--interval", "10ms", "--json")

	// The second campaigner waits, then runs its command as leader once the
	// first resigns.
	out2, err2, wait2 := start(ctx, dbURL, "election", "campaign", "--name", "sched", "--ttl", "5s", "--value", "10.0.0.2:80",
		"--", "sh", "-c", `echo "leading with $PGQUOTA_LEASE_TOKEN"`)
	time.Sleep(200 * time.Millisecond)
	require.NotContains(t, out2.String(), "leading", "one leader at a time")
	interrupt()
	require.Equal(t, cli.ExitOK, wait1(), err1.String())
	require.Equal(t, cli.ExitOK, wait2(), err2.String())
	require.Regexp(t, `leading with \d+`, out2.String())
	second, err := strconv.ParseInt(strings.TrimSpace(out2.String()[strings.LastIndex(out2.String(), " ")+1:]), 10, 64)
	require.NoError(t, err)
	require.Greater(t, second, first.Token)

	require.Eventually(t, func() bool { return strings.Count(wout.String(), "\n") >= 2 }, 3*time.Second, 10*time.Millisecond)
	stopWatch()
	require.Equal(t, cli.ExitOK, wwait())
	lines := strings.Split(strings.TrimSpace(wout.String()), "\n")
	var seen []int64
	for _, line := range lines {
		var l struct {
			Token int64 `json:"token"`
			Held  bool  `json:"held"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		if l.Held && (len(seen) == 0 || seen[len(seen)-1] != l.Token) {
			seen = append(seen, l.Token)
		}
	}
	require.Equal(t, first.Token, seen[0], "the watcher saw the first leader first")

	requireError(t, runDB(t, dbURL, "election", "resign", "--name", "sched", "--token", fmt.Sprint(first.Token+1000)), cli.ExitDenied, "lease lost")
	r = runDB(t, dbURL, "election", "leader", "--name", "sched")
	require.Equal(t, cli.ExitDenied, r.code, "both resigned")
}
