package pgtest

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The suite's connection budget. Every connection a test opens on the test
// server counts against it: the pools of Connect, NewPool and ConnectOwner
// (their MaxConns), DatabaseConns for each database of NewURL and
// NewEmptyURL (pgtestdb's own connection, a CLI command's), and what a test
// declares with Reserve for connections it opens by other means (the lab's
// requests, say). A test waits until its connections fit the share of its
// test binary, and gives them back when it ends.
const (
	// EnvMaxConns names the variable that holds how many connections the
	// whole suite may hold on the server at once (all test binaries
	// together). Default DefaultMaxConns.
	EnvMaxConns = "PGQUOTA_TEST_MAX_CONNS"
	// EnvBinaries names the variable that holds how many test binaries run
	// at once (go test -p); each gets EnvMaxConns / EnvBinaries. Default
	// DefaultBinaries, the -p of `make test`: with `go test -p N`, set it
	// to N, else N binaries may hold N times the budget.
	EnvBinaries = "PGQUOTA_TEST_BINARIES"
	// DefaultMaxConns leaves 40 of PostgreSQL's default max_connections
	// (100) to others.
	DefaultMaxConns = 60
	// DefaultBinaries is `make test`'s go test -p.
	DefaultBinaries = 1
	// DatabaseConns is what a test's databases cost beyond the pools on
	// them, once per test however many it creates (one at a time):
	// pgtestdb's connection to create and drop one, and the pool of a CLI
	// command run against it.
	DatabaseConns = 2
	// budgetWait is how long a test waits for its share before it fails
	// naming the budget and who holds it.
	budgetWait = 5 * time.Minute
)

// Budget returns the connections one test binary may hold on the test
// server at once, and a description of where the figure comes from.
func Budget() (int, string) {
	total, bins := envInt(EnvMaxConns, DefaultMaxConns), envInt(EnvBinaries, DefaultBinaries)
	share := max(total/bins, 1)
	return share, fmt.Sprintf("%d connections per test binary (%s=%d over %s=%d binaries run at once)",
		share, EnvMaxConns, total, EnvBinaries, bins)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// limiter is the binary's account of connections held per test.
type account struct {
	mu      sync.Mutex
	cond    *sync.Cond
	used    int
	held    map[testing.TB]int
	waiting map[testing.TB]bool
	dbs     map[testing.TB]bool
}

var limiter = account{held: map[testing.TB]int{}, waiting: map[testing.TB]bool{}, dbs: map[testing.TB]bool{}}

func init() { limiter.cond = sync.NewCond(&limiter.mu) }

// Reserve counts n more connections against the budget for tb, until tb
// ends: a test declares with it the connections it opens on the test
// server other than through Connect, NewPool, ConnectOwner, NewURL and
// NewEmptyURL (which count their own). It waits while the binary's share
// is taken by other tests, and fails tb with the budget's figures when tb
// alone would need more than the share, or when the share stays taken for
// 5 minutes.
func Reserve(tb testing.TB, n int, what string) {
	tb.Helper()
	reserve(tb, n, what, false)
}

// reserveDatabases counts DatabaseConns for tb's first database.
func reserveDatabases(tb testing.TB) {
	tb.Helper()
	limiter.mu.Lock()
	first := !limiter.dbs[tb]
	limiter.mu.Unlock()
	if first {
		reserve(tb, DatabaseConns, "its test databases", false)
		limiter.mu.Lock()
		limiter.dbs[tb] = true
		limiter.mu.Unlock()
	}
}

// ReserveAtLeast is Reserve up to a total: it makes tb hold at least n
// connections of the budget in all, for a test that runs several commands
// one after the other, each opening up to n (the CLI's lab and bench).
func ReserveAtLeast(tb testing.TB, n int, what string) {
	tb.Helper()
	reserve(tb, n, what, true)
}

func reserve(tb testing.TB, n int, what string, total bool) {
	tb.Helper()
	share, desc := Budget()
	l := &limiter
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := l.held[tb]
	if total {
		n -= mine
	}
	if n <= 0 {
		return
	}
	if mine+n > share {
		tb.Fatalf("pgtest: %s asks for %d connections (%s) on top of the %d it holds, more than the suite's budget of %s: raise %s, or open fewer",
			tb.Name(), n, what, mine, desc, EnvMaxConns)
	}
	deadline := time.Now().Add(budgetWait)
	timer := time.AfterFunc(budgetWait, func() { l.mu.Lock(); l.cond.Broadcast(); l.mu.Unlock() })
	defer timer.Stop()
	for l.used+n > share && !l.stalled(tb) {
		if time.Now().After(deadline) {
			tb.Fatalf("pgtest: %s waited %s for %d connections (%s): the budget of %s is held by %s",
				tb.Name(), budgetWait, n, what, desc, l.holders())
		}
		l.waiting[tb] = true
		l.cond.Wait()
		delete(l.waiting, tb)
	}
	if mine == 0 {
		tb.Cleanup(func() {
			l.mu.Lock()
			l.used -= l.held[tb]
			delete(l.held, tb)
			delete(l.dbs, tb)
			l.cond.Broadcast()
			l.mu.Unlock()
		})
	}
	l.held[tb] += n
	l.used += n
}

// stalled reports whether tb, which holds connections already, must go
// over the share to make progress: every test that holds connections is
// waiting for more (a test with parallel subtests keeps its own until
// they end), so none would ever give any back. tb is then let through.
// Called with l.mu held.
func (l *account) stalled(tb testing.TB) bool {
	if l.held[tb] == 0 {
		return false
	}
	for other, n := range l.held {
		if n > 0 && other != tb && !l.waiting[other] {
			return false
		}
	}
	return true
}

// holders lists the tests holding connections, largest first. Called with
// l.mu held.
func (l *account) holders() string {
	type h struct {
		name string
		n    int
	}
	var hs []h
	for tb, n := range l.held {
		hs = append(hs, h{tb.Name(), n})
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].n > hs[j].n })
	parts := make([]string, len(hs))
	for i, x := range hs {
		parts[i] = fmt.Sprintf("%s (%d)", x.name, x.n)
	}
	if len(parts) == 0 {
		return "no test"
	}
	return strings.Join(parts, ", ")
}
