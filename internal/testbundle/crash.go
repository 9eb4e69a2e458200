package testbundle

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

// EnvCrashRounds names the environment variable that sets how many
// immediate shutdowns the crash tests make (CrashRounds).
const EnvCrashRounds = "PGQUOTA_CRASH_ROUNDS"

// Helpers of the tests that shut a private server down in immediate mode
// while goroutines call it (the *UnderLoad tests).

// CrashRounds returns the number of immediate shutdowns a crash test makes:
// $PGQUOTA_CRASH_ROUNDS (EnvCrashRounds) when set, else def.
func CrashRounds(t *testing.T, def int) int {
	t.Helper()
	s := os.Getenv(EnvCrashRounds)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "%s=%q", EnvCrashRounds, s)
	require.Positive(t, n, "%s=%q", EnvCrashRounds, s)
	return n
}

// CrashTarget is a database of a crash test's server and the URL its load
// connects with.
type CrashTarget struct{ What, Database, URL string }

// NewCrashCluster starts a private server whose WAL writer sleeps 10s (an
// asynchronous commit stays unflushed until the crash) with two migrated
// databases: "durable", used as superuser postgres with the defaults
// (synchronous_commit on), and "async_role", used by login role app_async,
// a member of pgquota_app with synchronous_commit = off (ALTER ROLE), as in
// TestLeaseCallsSurviveImmediateShutdownUnderAsyncCommit. Round r of a test
// uses targets[r%2].
func NewCrashCluster(t *testing.T, name string) (*pgcluster.Cluster, []CrashTarget) {
	t.Helper()
	cl := pgcluster.New(t, name, pgcluster.Options{"wal_writer_delay": "'10s'"})
	cl.CreateDatabase("durable")
	cl.CreateDatabase("async_role")
	cl.Exec("postgres", `CREATE ROLE app_async LOGIN IN ROLE pgquota_app;
		ALTER ROLE app_async SET synchronous_commit = off`)
	return cl, []CrashTarget{
		{"synchronous_commit on (the default)", "durable", cl.URL("durable")},
		{"ALTER ROLE ... SET synchronous_commit = off (role app_async, a member of pgquota_app)", "async_role", cl.URL("async_role", "app_async")},
	}
}

// CrashLoadPool opens a pool of at most maxConns connections on url and a
// client on it with cfg (nil for the defaults); the pool closes in
// t.Cleanup, or earlier with the returned function.
func CrashLoadPool(t *testing.T, url string, maxConns int, cfg *quota.Config) (*quota.Client, func()) {
	t.Helper()
	pool := pgcluster.Pool(t, url+"&pool_max_conns="+strconv.Itoa(maxConns))
	client, err := quota.New(pool, cfg)
	require.NoError(t, err)
	return client, pool.Close
}

// RequireSynchronousCommit fails the test unless the client's sessions
// run with the target's synchronous_commit: the setting under test is in
// force.
func RequireSynchronousCommit(t *testing.T, c *quota.Client, tg CrashTarget) {
	t.Helper()
	var sc string
	require.NoError(t, c.Pool().QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&sc))
	want := "on"
	if tg.Database == "async_role" {
		want = "off"
	}
	require.Equal(t, want, sc, "the setting under test is in force (%s)", tg.What)
}

// IsPreSend reports whether err is a clear error of a call that sent
// nothing: a failed connection attempt (*pgconn.ConnectError: the server
// is down, or starting up and refusing connections with 57P03), or an
// error pgconn guarantees was raised before anything was sent
// (pgconn.SafeToRetry).
func IsPreSend(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || pgconn.SafeToRetry(err)
}

// CrashLoad runs load goroutines and shuts the server down in immediate
// mode in the middle of it. Each goroutine makes one call per enter/leave
// pair; between the crash and the resume the gate holds them (after the
// calls against the stopped server have failed), so the test can read the
// state the restarted server recovered before any new call changes it.
type CrashLoad struct {
	t  *testing.T
	wg sync.WaitGroup

	gate    sync.RWMutex // held for reading by every call, for writing to pause
	paused  bool
	stopped bool
	resumed chan struct{}

	stopOnce sync.Once

	mu       sync.Mutex
	unknown  int // errors wrapping quota.ErrOutcomeUnknown
	preSend  int // IsPreSend errors
	CrashDur time.Duration
	DownAt   time.Time // when the postmaster had exited
}

// NewCrashLoad returns a load that stops in t.Cleanup at the latest (so a
// check that fails mid-load stops its goroutines before the server goes).
func NewCrashLoad(t *testing.T) *CrashLoad {
	l := &CrashLoad{t: t, resumed: make(chan struct{})}
	t.Cleanup(l.Stop)
	return l
}

// Start runs n goroutines, each calling op(worker) until stop.
func (l *CrashLoad) Start(n int, op func(worker int)) {
	for w := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for l.Enter() {
				op(w)
				l.gate.RUnlock()
			}
		}()
	}
}

// Enter waits while the load is paused; it returns false once stopped,
// else true with the gate held for reading.
func (l *CrashLoad) Enter() bool {
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

// Crash shuts cl down in immediate mode while the calls run, lets them
// fail against the stopped server for a moment, pauses them (waiting for
// the calls in flight to return), restarts cl and returns with the load
// still paused.
func (l *CrashLoad) Crash(cl *pgcluster.Cluster) {
	l.t.Helper()
	start := time.Now()
	cl.Crash()
	l.DownAt = time.Now()
	time.Sleep(30 * time.Millisecond)
	l.gate.Lock()
	l.paused = true
	l.gate.Unlock()
	cl.Start()
	l.CrashDur = time.Since(start)
}

// Resume lets the paused calls go on.
func (l *CrashLoad) Resume() {
	l.gate.Lock()
	l.paused = false
	close(l.resumed)
	l.resumed = make(chan struct{})
	l.gate.Unlock()
}

// Stop ends the load and waits for its goroutines. Stopping again is
// harmless.
func (l *CrashLoad) Stop() {
	l.stopOnce.Do(func() {
		l.gate.Lock()
		l.stopped = true
		close(l.resumed)
		l.gate.Unlock()
	})
	l.wg.Wait()
}

// Failed classifies the error of a state-changing call: true when its
// outcome is unknown (it wraps quota.ErrOutcomeUnknown), false when it
// clearly sent nothing (IsPreSend, or one of the errors allowed, which
// mean nothing was written). Any other error fails the test: the README
// promises that every error of a state-changing call either wraps
// ErrOutcomeUnknown or means nothing was written, and a crash may cause
// only those two kinds.
func (l *CrashLoad) Failed(what string, err error, allowed ...error) (unknown bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, quota.ErrOutcomeUnknown):
		l.unknown++
		return true
	case IsPreSend(err):
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

// ErrorCounts returns how many errors failed counted as unknown and as
// pre-send.
func (l *CrashLoad) ErrorCounts() (unknown, preSend int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unknown, l.preSend
}

// CrashClient opens a client on url and returns it with a function that
// closes its pool (before the server is shut down).
func CrashClient(t *testing.T, url string) (*quota.Client, func()) {
	t.Helper()
	pool := pgcluster.Pool(t, url)
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	return client, pool.Close
}
