//go:build citus

package cli_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/quota"
)

// A worker with a synchronous streaming standby crashes (immediate
// shutdown) under grant and fenced-write load from two Clients; the
// standby is promoted and put in its place (citus_update_node), and the
// coordinator finishes the two-phase commits the worker was in the middle
// of (recover_prepared_transactions()). Tokens and
// their epoch come from the coordinator, so the failover changes nothing
// about them; what lives on the worker survives because every commit
// there waited for the standby: no counter holds fewer units than its
// callers were told were granted, none is above its limit, no counter
// holds more than that plus the calls reported with an unknown outcome
// (a call that failed otherwise did not commit), the
// fence mark is at least the last token whose write was acknowledged (an
// older token is refused), the next lease gets a higher token than any
// before, and 20 concurrent grants at a limit of 5 on the promoted worker
// give 5.
func TestCitusWorkerFailoverToSynchronousStandbyKeepsLimitsAndFences(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	w := c.Workers()[0]
	standby := w.NewStandby("citus-worker1-standby")
	w.Exec("postgres", `ALTER SYSTEM SET synchronous_standby_names = '*'`)
	w.Exec("postgres", `SELECT pg_reload_conf()`)
	require.Eventually(t, func() bool {
		var state string
		w.QueryValue("postgres", `SELECT coalesce(max(sync_state), '') FROM pg_stat_replication`, &state)
		return state == "sync"
	}, 30*time.Second, 50*time.Millisecond, "the standby became synchronous")

	clients := citusClients(t, c, 2)
	a := clients[0]
	for _, d := range []quota.Definition{
		{Name: "load", Window: quota.WindowDay, DefaultLimit: quota.Limit(400)},
		{Name: "after", Window: quota.WindowDay, DefaultLimit: quota.Limit(5)},
	} {
		_, err := a.DefineQuota(ctx, d)
		require.NoError(t, err)
	}
	var members []string
	for i := range 6 {
		members = append(members, citusValueOn(t, c, "pgquota.usage", fmt.Sprintf("fo%d-", i), w.Port))
	}
	resource := citusValueOn(t, c, "pgquota.lease", "job", w.Port)

	load := startCitusLoad(ctx, clients, "load", members, resource)

	time.Sleep(1500 * time.Millisecond)
	crashAt := time.Now()
	w.Crash()
	t.Logf("worker %d crashed at %s", w.Port, crashAt.Format("15:04:05.000000"))
	time.Sleep(500 * time.Millisecond)
	standby.Promote()
	c.Coordinator.Exec(cituscluster.Database, fmt.Sprintf(
		`SELECT citus_update_node(nodeid, '127.0.0.1', %d) FROM pg_dist_node WHERE nodeport = %d`, standby.Port, w.Port))
	// Grants that wrote several shards committed with two-phase commit:
	// the coordinator recorded the commit, and a COMMIT PREPARED the
	// crashed worker never ran is still prepared on the promoted standby,
	// holding its counters' row locks, until Citus's recovery finishes it
	// (the maintenance daemon does every citus.recover_2pc_interval, 1 min
	// by default): run it now, as the failover procedure says.
	var recovered int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT recover_prepared_transactions()`, &recovered)
	t.Logf("recover_prepared_transactions() finished %d prepared transactions", recovered)
	time.Sleep(2 * time.Second)
	load.finish()
	var prepared int
	standby.QueryValue(cituscluster.Database, `SELECT count(*) FROM pg_prepared_xacts`, &prepared)
	require.Zero(t, prepared, "no prepared transaction left on the promoted worker")

	load.checkCounters(t, a, 400)
	load.checkFence(t, a)

	member := citusValueOn(t, c, "pgquota.usage", "after", standby.Port)
	require.EqualValues(t, 5, grantRace(t, clients, "after", member), "20 concurrent grants at a limit of 5 on the promoted worker")
}
