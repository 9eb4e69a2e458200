package quota_test

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
)

// Helpers of the tests that shut a private server down in immediate mode
// while goroutines call it (the *UnderLoad tests).

// crashRounds returns the number of immediate shutdowns a crash test makes:
// $PGQUOTA_CRASH_ROUNDS (envCrashRounds) when set, else def.
func crashRounds(t *testing.T, def int) int {
	t.Helper()
	s := os.Getenv(envCrashRounds)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "%s=%q", envCrashRounds, s)
	require.Positive(t, n, "%s=%q", envCrashRounds, s)
	return n
}

// crashTarget is a database of a crash test's server and the URL its load
// connects with.
type crashTarget struct{ what, database, url string }

// newCrashCluster starts a private server whose WAL writer sleeps 10s (an
// asynchronous commit stays unflushed until the crash) with two migrated
// databases: "durable", used as superuser postgres with the defaults
// (synchronous_commit on), and "async_role", used by login role app_async,
// a member of pgquota_app with synchronous_commit = off (ALTER ROLE), as in
// TestLeaseCallsSurviveImmediateShutdownUnderAsyncCommit. Round r of a test
// uses targets[r%2].
func newCrashCluster(t *testing.T, name string) (*pgcluster.Cluster, []crashTarget) {
	t.Helper()
	cl := pgcluster.New(t, name, pgcluster.Options{"wal_writer_delay": "'10s'"})
	cl.CreateDatabase("durable")
	cl.CreateDatabase("async_role")
	cl.Exec("postgres", `CREATE ROLE app_async LOGIN IN ROLE pgquota_app;
		ALTER ROLE app_async SET synchronous_commit = off`)
	return cl, []crashTarget{
		{"synchronous_commit on (the default)", "durable", cl.URL("durable")},
		{"ALTER ROLE ... SET synchronous_commit = off (role app_async, a member of pgquota_app)", "async_role", cl.URL("async_role", "app_async")},
	}
}

// crashLoadPool opens a pool of at most maxConns connections on url and a
// client on it with cfg (nil for the defaults); the pool closes in
// t.Cleanup, or earlier with the returned function.
func crashLoadPool(t *testing.T, url string, maxConns int, cfg *quota.Config) (*quota.Client, func()) {
	t.Helper()
	pool := pgcluster.Pool(t, url+"&pool_max_conns="+strconv.Itoa(maxConns))
	client, err := quota.New(pool, cfg)
	require.NoError(t, err)
	return client, pool.Close
}

// requireSynchronousCommit fails the test unless the client's sessions
// run with the target's synchronous_commit: the setting under test is in
// force.
func requireSynchronousCommit(t *testing.T, c *quota.Client, tg crashTarget) {
	t.Helper()
	var sc string
	require.NoError(t, c.Pool().QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&sc))
	want := "on"
	if tg.database == "async_role" {
		want = "off"
	}
	require.Equal(t, want, sc, "the setting under test is in force (%s)", tg.what)
}

// isPreSend reports whether err is a clear error of a call that sent
// nothing: a failed connection attempt (*pgconn.ConnectError: the server
// is down, or starting up and refusing connections with 57P03), or an
// error pgconn guarantees was raised before anything was sent
// (pgconn.SafeToRetry).
func isPreSend(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || pgconn.SafeToRetry(err)
}

// crashLoad runs load goroutines and shuts the server down in immediate
// mode in the middle of it. Each goroutine makes one call per enter/leave
// pair; between the crash and the resume the gate holds them (after the
// calls against the stopped server have failed), so the test can read the
// state the restarted server recovered before any new call changes it.
type crashLoad struct {
	t  *testing.T
	wg sync.WaitGroup

	gate    sync.RWMutex // held for reading by every call, for writing to pause
	paused  bool
	stopped bool
	resumed chan struct{}

	stopOnce sync.Once

	mu       sync.Mutex
	unknown  int // errors wrapping quota.ErrOutcomeUnknown
	preSend  int // isPreSend errors
	crashDur time.Duration
	downAt   time.Time // when the postmaster had exited
}

// newCrashLoad returns a load that stops in t.Cleanup at the latest (so a
// check that fails mid-load stops its goroutines before the server goes).
func newCrashLoad(t *testing.T) *crashLoad {
	l := &crashLoad{t: t, resumed: make(chan struct{})}
	t.Cleanup(l.stop)
	return l
}

// start runs n goroutines, each calling op(worker) until stop.
func (l *crashLoad) start(n int, op func(worker int)) {
	for w := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for l.enter() {
				op(w)
				l.gate.RUnlock()
			}
		}()
	}
}

// enter waits while the load is paused; it returns false once stopped,
// else true with the gate held for reading.
func (l *crashLoad) enter() bool {
	for {
		l.gate.RLock()
		if l.stopped {
			l.gate.RUnlock()
			return false
		}
		if !l.paused {
			return true
		}
		ch := l.resumed
		l.gate.RUnlock()
		<-ch
	}
}

// crash shuts cl down in immediate mode while the calls run, lets them
// fail against the stopped server for a moment, pauses them (waiting for
// the calls in flight to return), restarts cl and returns with the load
// still paused.
func (l *crashLoad) crash(cl *pgcluster.Cluster) {
	l.t.Helper()
	start := time.Now()
	cl.Crash()
	l.downAt = time.Now()
	time.Sleep(30 * time.Millisecond)
	l.gate.Lock()
	l.paused = true
	l.gate.Unlock()
	cl.Start()
	l.crashDur = time.Since(start)
}

// resume lets the paused calls go on.
func (l *crashLoad) resume() {
	l.gate.Lock()
	l.paused = false
	close(l.resumed)
	l.resumed = make(chan struct{})
	l.gate.Unlock()
}

// stop ends the load and waits for its goroutines. Stopping again is
// harmless.
func (l *crashLoad) stop() {
	l.stopOnce.Do(func() {
		l.gate.Lock()
		l.stopped = true
		close(l.resumed)
		l.gate.Unlock()
	})
	l.wg.Wait()
}

// failed classifies the error of a state-changing call: true when its
// outcome is unknown (it wraps quota.ErrOutcomeUnknown), false when it
// clearly sent nothing (isPreSend, or one of the errors allowed, which
// mean nothing was written). Any other error fails the test: the README
// promises that every error of a state-changing call either wraps
// ErrOutcomeUnknown or means nothing was written, and a crash may cause
// only those two kinds.
func (l *crashLoad) failed(what string, err error, allowed ...error) (unknown bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, quota.ErrOutcomeUnknown):
		l.unknown++
		return true
	case isPreSend(err):
		l.preSend++
		return false
	}
	for _, a := range allowed {
		if errors.Is(err, a) {
			return false
		}
	}
	l.t.Errorf("%s: an error that neither wraps ErrOutcomeUnknown nor is a clear error before sending: %v (%T)", what, err, err)
	return false
}

// errorCounts returns how many errors failed counted as unknown and as
// pre-send.
func (l *crashLoad) errorCounts() (unknown, preSend int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unknown, l.preSend
}
