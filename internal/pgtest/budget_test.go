package pgtest

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeTB is a test the budget accounts for: its cleanups run when end is
// called, and Fatalf records the message and stops its goroutine.
type fakeTB struct {
	testing.TB
	name     string
	mu       sync.Mutex
	cleanups []func()
	fatal    string
}

func (f *fakeTB) Name() string      { return f.name }
func (f *fakeTB) Helper()           {}
func (f *fakeTB) Cleanup(fn func()) { f.mu.Lock(); f.cleanups = append(f.cleanups, fn); f.mu.Unlock() }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// run calls fn as f's test body on its own goroutine and returns when it
// returned or failed.
func (f *fakeTB) run(fn func()) <-chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	return done
}

// A test that asks for more connections than its binary's share fails at
// once with the budget's figures and the variable to raise; within the
// share, a test waits while others hold the share and goes on when they
// end, so the binary never holds more than its share.
func TestBudgetKeepsEachBinaryWithinItsShare(t *testing.T) {
	t.Setenv(EnvMaxConns, "8")
	t.Setenv(EnvBinaries, "2")
	share, desc := Budget()
	require.Equal(t, 4, share)
	require.Contains(t, desc, "PGQUOTA_TEST_MAX_CONNS=8 over PGQUOTA_TEST_BINARIES=2")

	greedy := &fakeTB{name: "TestGreedy"}
	<-greedy.run(func() { Reserve(greedy, 5, "a pool of 5") })
	require.Contains(t, greedy.fatal, "TestGreedy asks for 5 connections (a pool of 5)")
	require.Contains(t, greedy.fatal, "4 connections per test binary (PGQUOTA_TEST_MAX_CONNS=8 over PGQUOTA_TEST_BINARIES=2 binaries run at once)")
	greedy.end()

	first := &fakeTB{name: "TestFirst"}
	<-first.run(func() { Reserve(first, 3, "a pool of 3") })
	require.Empty(t, first.fatal)

	second := &fakeTB{name: "TestSecond"}
	got := second.run(func() { Reserve(second, 2, "a pool of 2") })
	select {
	case <-got:
		t.Fatalf("the second test got 2 connections while the first held 3 of 4: %q", second.fatal)
	case <-time.After(200 * time.Millisecond):
	}
	first.end()
	select {
	case <-got:
	case <-time.After(time.Minute):
		t.Fatal("the second test still waits after the first ended")
	}
	require.Empty(t, second.fatal)

	// ReserveAtLeast raises a test's holding to a total, not by it.
	ReserveAtLeast(second, 2, "a command's pool")
	limiter.mu.Lock()
	require.Equal(t, 2, limiter.held[second])
	limiter.mu.Unlock()
	second.end()
	limiter.mu.Lock()
	defer limiter.mu.Unlock()
	require.Zero(t, limiter.used, "every connection is given back when its test ends")
}
