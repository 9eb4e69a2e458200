package lab

import (
	"context"
	"errors"
	"net"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/internal/scratch"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// newTestEnv makes a lab environment on a scratch database of the test
// server, dropped when the test ends.
func newTestEnv(t *testing.T, cfg Config) (*Env, []*Client) {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	db, err := scratch.Create(ctx, admin, "pgquota_labtest")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Drop(ctx)) })
	env := &Env{Config: cfg, Database: db.Name}
	pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
	env.DB, err = db.Pool(ctx, 2)
	require.NoError(t, err)
	t.Cleanup(env.DB.Close)
	env.Quota, err = quota.New(env.DB, nil)
	require.NoError(t, err)
	env.Leases, err = lease.New(env.Quota)
	require.NoError(t, err)
	env.Fences, err = fence.New(env.Quota)
	require.NoError(t, err)
	clients, err := openClients(ctx, db, cfg.Requests, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range clients {
			c.Pool.Close()
		}
	})
	return env, clients
}

// runRedlock runs s with cfg and fails the test, with the servers' log
// tail, when its servers cannot start.
func runRedlock(t *testing.T, cfg Config, s Strategy) (StrategyReport, *Env) {
	t.Helper()
	env, clients := newTestEnv(t, cfg)
	sr, err := runStrategy(context.Background(), env, clients, s)
	require.NoError(t, err)
	require.Equal(t, StatusOK, sr.Status, "redis-server must start for this test (Debian package redis-server): %s", sr.Reason)
	require.Len(t, sr.Runs, cfg.Runs)
	return sr, env
}

func redlockTestConfig() Config {
	cfg := DefaultConfig()
	cfg.Requests = 6
	cfg.Limit = 1
	cfg.Runs = 2
	return cfg
}

var restartFault = regexp.MustCompile(`^request 1 got the lock on instances 1-3 \(its proxies to 4 and 5 reset every connection\); ` +
	`instance 3 \(port \d+\) was killed by pid (\d+) \(SIGKILL\) and started again on its port as pid (\d+) without persistence`)

// The restarted instance forgets request 1's lock: a second request forms
// a quorum on instances 3, 4 and 5 while request 1 still believes it holds
// the lock (their believed-held spans overlap), both read 0 and both write
// 1: two granted against a limit of 1, and the counter says 1.
func TestRedlockRestartedInstanceMakesTwoHolders(t *testing.T) {
	t.Parallel()
	cfg := redlockTestConfig()
	sr, env := runRedlock(t, cfg, &redlock{})
	require.False(t, sr.Safe)
	for i, r := range sr.Runs {
		require.Zero(t, r.Errors, r.FirstError)
		require.Equal(t, int64(2), r.Granted, "run %d: request 1 and the holder that formed a quorum after the restart", i+1)
		require.Equal(t, int64(4), r.Denied)
		require.Equal(t, int64(1), r.Leaked)
		require.Equal(t, int64(1), r.Counter, "both wrote read+1 = 1")
		require.Equal(t, int64(cfg.Requests), r.Holds, "every request held the lock once")
		require.Positive(t, r.TwoHolders, "run %d: request 1 still believed it held the lock", i+1)
		require.Positive(t, r.TwoHoldersMS)
		m := restartFault.FindStringSubmatch(r.Fault)
		require.NotNil(t, m, r.Fault)
		require.NotEqual(t, m[1], m[2], "a new process")
		require.Zero(t, r.StaleRejected)
	}
	require.Equal(t, cfg.Runs, sr.LeakedRuns)
	n, err := readCounter(context.Background(), env.DB, "redlock")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// The control experiment: the same partition without the restart. Request
// 1 holds the lock on instances 1-3, a quorum no other request can break
// (they reach 4 and 5 only), so Redlock holds: one grant, no two holders.
// The leak above is the restart's doing, not the lab's.
func TestRedlockPartitionAloneKeepsOneHolder(t *testing.T) {
	t.Parallel()
	cfg := redlockTestConfig()
	cfg.Runs = 1 // request 1 waits out nearly its whole validity for a second holder
	sr, _ := runRedlock(t, cfg, &redlock{noRestart: true})
	for _, r := range sr.Runs {
		require.Zero(t, r.Errors, r.FirstError)
		require.Equal(t, int64(1), r.Granted)
		require.Zero(t, r.Leaked)
		require.Zero(t, r.TwoHolders)
		require.Equal(t, int64(cfg.Requests), r.Holds)
		require.Contains(t, r.Fault, "no restart")
	}
}

// With pgquota tokens behind the same failing Redlock: the two holders
// still happen, but request 1's write carries a lower token than the
// second holder's and is rejected; request 1 starts over, reads 1 and is
// denied. Exactly one grant, one stale write, and the rows say so: the
// counter is 1, written under a token below the resource's highest (the
// later holders presented theirs), and no token lease is left held.
func TestRedlockFencedRejectsTheFirstHoldersWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := redlockTestConfig()
	sr, env := runRedlock(t, cfg, &redlock{fenced: true})
	require.True(t, sr.Safe)
	for i, r := range sr.Runs {
		require.Zero(t, r.Errors, r.FirstError)
		require.Equal(t, int64(1), r.Granted, "run %d", i+1)
		require.Equal(t, int64(cfg.Requests-1), r.Denied)
		require.Zero(t, r.Leaked)
		require.Equal(t, int64(1), r.StaleRejected, "request 1's write is fenced off")
		require.Equal(t, int64(1), r.Counter)
		require.Positive(t, r.TwoHolders, "the Redlock failed all the same")
		require.Equal(t, int64(cfg.Requests+1), r.Holds, "request 1 held twice: it started over")
		require.Regexp(t, restartFault, r.Fault)
	}
	require.Equal(t, cfg.Runs, sr.ExactRuns)
	row, err := env.Fences.Row(ctx, redlockFencedResource, "counter")
	require.NoError(t, err)
	require.Equal(t, "1", row.Value)
	fence, err := env.Fences.State(ctx, redlockFencedResource)
	require.NoError(t, err)
	require.Greater(t, fence.Highest, row.Token)
	var held int
	require.NoError(t, env.DB.QueryRow(ctx, `SELECT count(*) FROM pgquota.lease
		WHERE starts_with(name, $1) AND expires_at > clock_timestamp()`, redlockTokenLease).Scan(&held))
	require.Zero(t, held)
}

// The lab's servers are stopped by process id: after Close no process of
// theirs is left and their ports refuse connections.
func TestRedlockServersStoppedByPID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := redlockTestConfig()
	env, _ := newTestEnv(t, cfg)
	s := &redlock{}
	err := s.Prepare(ctx, env)
	require.NoError(t, err, "redis-server must start for this test (Debian package redis-server)")
	require.Len(t, s.srvs, redlockInstances)
	var pids []int
	var addrs []string
	for _, srv := range s.srvs {
		require.NoError(t, ping(srv.Addr()))
		pids, addrs = append(pids, srv.PID()), append(addrs, srv.Addr())
	}
	require.NoError(t, s.Close(ctx, env))
	for i, pid := range pids {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "pid %d", pid)
		c, err := net.DialTimeout("tcp", addrs[i], time.Second)
		if err == nil {
			_ = c.Close()
		}
		require.Error(t, err, addrs[i])
	}
}

// A proxy cut resets connections open through it and new ones; restored,
// it forwards again.
func TestTCPProxyCutResetsConnections(t *testing.T) {
	t.Parallel()
	srv, err := startRedis(context.Background(), "redis-server", t.TempDir(), "proxy")
	require.NoError(t, err, "redis-server must start for this test (Debian package redis-server)")
	t.Cleanup(srv.kill)
	p, err := newTCPProxy(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(p.Close)
	require.NoError(t, ping(p.Addr()))
	open, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer open.Close()
	p.SetCut(true)
	require.Error(t, ping(p.Addr()))
	_ = open.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = open.Read(make([]byte, 1))
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the open connection was reset, not left hanging: %v", err)
	p.SetCut(false)
	require.NoError(t, ping(p.Addr()))
}

func TestOverlaps(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	h := func(from, until int) Hold { return Hold{From: at(from), Until: at(until)} }
	for name, tc := range map[string]struct {
		holds   []Hold
		moments int64
		totalMS int
	}{
		"none":                {nil, 0, 0},
		"one":                 {[]Hold{h(0, 10)}, 0, 0},
		"disjoint":            {[]Hold{h(0, 10), h(20, 30)}, 0, 0},
		"touching":            {[]Hold{h(0, 10), h(10, 20)}, 0, 0},
		"overlap":             {[]Hold{h(0, 10), h(5, 20)}, 1, 5},
		"nested":              {[]Hold{h(0, 100), h(10, 20)}, 1, 10},
		"long holder, two in": {[]Hold{h(0, 100), h(10, 20), h(30, 40)}, 2, 20},
		"three at once":       {[]Hold{h(0, 30), h(10, 40), h(20, 50)}, 1, 30},
		"empty span ignored":  {[]Hold{h(0, 10), h(5, 5)}, 0, 0},
		"unordered":           {[]Hold{h(30, 40), h(0, 100)}, 1, 10},
	} {
		moments, total := overlaps(tc.holds)
		require.Equal(t, tc.moments, moments, name)
		require.Equal(t, time.Duration(tc.totalMS)*time.Millisecond, total, name)
	}
}
