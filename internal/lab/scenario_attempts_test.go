package lab_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgquota/pgquota/internal/lab"
)

// attempt is one try of a timing-dependent scenario (a leak that shows
// only when the injected pauses land as planned, a lock granted before
// the give-up deadline on a busy machine). It is the require.TestingT of
// the scenario's timing-dependent checks: a failed check ends the attempt,
// not the test. Checks made on the test itself (safety: a safe strategy
// never grants more than the limit) fail the test in any attempt.
type attempt struct {
	failures []string
	seen     string
}

func (a *attempt) Errorf(format string, args ...any) {
	a.failures = append(a.failures, fmt.Sprintf(format, args...))
}
func (a *attempt) FailNow() { panic(a) }
func (a *attempt) Helper()  {}

// saw records what the attempt's lab run did, for the failure message.
func (a *attempt) saw(rep *lab.Report) { a.seen = describeRuns(rep) }

// retryScenario runs scenario up to n times, until an attempt passes every
// check it makes on its attempt. When none does, the test fails with what
// every attempt saw, run by run, and the checks each failed.
func retryScenario(t *testing.T, n int, scenario func(a *attempt)) {
	t.Helper()
	var log strings.Builder
	for i := 1; i <= n; i++ {
		a := &attempt{}
		func() {
			defer func() {
				if r := recover(); r != nil && r != any(a) {
					panic(r)
				}
			}()
			scenario(a)
		}()
		if len(a.failures) == 0 {
			if i > 1 {
				t.Logf("attempt %d of %d passed; the earlier ones saw:\n%s", i, n, log.String())
			}
			return
		}
		fmt.Fprintf(&log, "attempt %d:\n%s  failed:\n", i, a.seen)
		for _, f := range a.failures {
			fmt.Fprintf(&log, "    %s\n", strings.ReplaceAll(strings.TrimSpace(f), "\n", "\n    "))
		}
	}
	t.Fatalf("no attempt of %d passed:\n%s", n, log.String())
}

// describeRuns is one line per run of every strategy in rep: what it
// granted, denied, leaked and refused, its errors and the first one.
func describeRuns(rep *lab.Report) string {
	if rep == nil {
		return "  (no report)\n"
	}
	var b strings.Builder
	for _, s := range rep.Strategies {
		if s.Status != lab.StatusOK {
			fmt.Fprintf(&b, "  %s: %s (%s)\n", s.Name, s.Status, s.Reason)
			continue
		}
		for i, r := range s.Runs {
			fmt.Fprintf(&b, "  %s run %d: granted %d denied %d leaked %d stale-rejected %d counter %d errors %d",
				s.Name, i+1, r.Granted, r.Denied, r.Leaked, r.StaleRejected, r.Counter, r.Errors)
			if r.FirstError != "" {
				fmt.Fprintf(&b, " (first: %s)", r.FirstError)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// requireInstalled fails the test at once when a strategy of rep could
// not run because what it needs is not installed: no retry helps that.
func requireInstalled(t *testing.T, rep *lab.Report) {
	t.Helper()
	for _, s := range rep.Strategies {
		if s.Status == lab.StatusUnavailable && strings.Contains(s.Reason, "not installed") {
			t.Fatalf("%s cannot run: %s", s.Name, s.Reason)
		}
	}
}

// requireNeverAboveLimit fails the test at once when a safe strategy of
// rep handed out more than limit in any run: safety holds in every
// attempt, retried or not.
func requireNeverAboveLimit(t *testing.T, rep *lab.Report, limit int64) {
	t.Helper()
	for _, s := range rep.Strategies {
		if !s.Safe || s.Status != lab.StatusOK {
			continue
		}
		for i, r := range s.Runs {
			if r.Granted > limit || r.Counter > limit || r.Leaked != 0 {
				t.Fatalf("%s run %d handed out more than the limit %d: granted %d, counter %d, leaked %d\n%s",
					s.Name, i+1, limit, r.Granted, r.Counter, r.Leaked, describeRuns(rep))
			}
		}
	}
}
