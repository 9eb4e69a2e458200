package lab_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/lab"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// TestLabLockServicesLeakUnlessFenced runs the lab's ZooKeeper and etcd
// strategies on the real servers (started by the lab, as `pgquota lab`
// does) with the lab's defaults, 20 requests for a limit of 1, three times:
// in every run the unfenced lock of each service grants more than the limit
// (its holders paused past their session or lease write anyway), and the
// fenced one grants exactly the limit, with the paused holders' writes
// refused as stale and the counter at 1. A server that cannot start makes
// the strategy unavailable, which fails the attempt with the reason. The
// leaks need the pauses to land as planned on a busy machine, so the
// scenario is tried up to 3 times (retryScenario: the failure shows every
// run of every attempt); the fenced locks may never exceed the limit in
// any attempt.
func TestLabLockServicesLeakUnlessFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	cfg := lab.DefaultConfig()
	cfg.Runs = 3
	cfg.Strategies = []string{"zookeeper", "zookeeper-fenced", "etcd", "etcd-fenced"}
	pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
	retryScenario(t, 3, func(a *attempt) {
		rep, err := lab.Run(ctx, admin, cfg)
		require.NoError(t, err)
		a.saw(rep)
		requireInstalled(t, rep)
		requireNeverAboveLimit(t, rep, cfg.Limit)
		require.Empty(a, rep.Violations)
		for _, name := range cfg.Strategies {
			s := byName(t, rep, name)
			require.Equal(a, lab.StatusOK, s.Status, "%s did not run: %s", name, s.Reason)
			require.Len(a, s.Runs, 3)
			for i, r := range s.Runs {
				require.Zero(a, r.Errors, "%s run %d: %s", name, i+1, r.FirstError)
				require.Equal(a, int64(20), r.Granted+r.Denied, "%s run %d", name, i+1)
				require.Equal(a, int64(1), r.Counter, "%s run %d: the counter", name, i+1)
				if s.Safe {
					require.Equal(a, int64(1), r.Granted, "%s run %d must grant exactly the limit", name, i+1)
					require.Zero(a, r.Leaked, "%s run %d", name, i+1)
					require.GreaterOrEqual(a, r.StaleRejected, int64(1), "%s run %d: the paused holders' writes must be refused as stale", name, i+1)
					require.LessOrEqual(a, r.StaleRejected, int64(cfg.Paused), "%s run %d: only paused holders go stale", name, i+1)
				} else {
					require.Greater(a, r.Granted, int64(1), "%s run %d must grant more than the limit", name, i+1)
					require.Equal(a, r.Granted-1, r.Leaked, "%s run %d", name, i+1)
					require.Zero(a, r.StaleRejected, "%s run %d", name, i+1)
				}
			}
		}
		require.Equal(a, 3, byName(t, rep, "zookeeper").LeakedRuns)
		require.Equal(a, 3, byName(t, rep, "etcd").LeakedRuns)
		require.Equal(a, 3, byName(t, rep, "zookeeper-fenced").ExactRuns)
		require.Equal(a, 3, byName(t, rep, "etcd-fenced").ExactRuns)
	})
}
