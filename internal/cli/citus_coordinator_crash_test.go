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

// The coordinator gets an immediate shutdown under grant and fenced-write
// load from two Clients over members and leases on both workers, and is
// started again (crash recovery; the prepared transactions it had
// recorded as committed are finished on the workers by
// recover_prepared_transactions()). Every counter holds at least the grants
// its callers were told succeeded and at most those plus the calls
// reported with an unknown outcome; no prepared transaction is left on a
// worker; the fence mark is at least the last acknowledged write's token
// and an older token is refused; the next lease's token is higher than
// every token issued before the crash.
func TestCitusCoordinatorCrashMidLoadKeepsLimitsAndTokens(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	clients := citusClients(t, c, 2)
	a := clients[0]
	_, err := a.DefineQuota(ctx, quota.Definition{Name: "load", Window: quota.WindowDay, DefaultLimit: quota.Limit(400)})
	require.NoError(t, err)
	var members []string
	for i, w := range c.Workers() {
		for j := range 4 {
			members = append(members, citusValueOn(t, c, "pgquota.usage", fmt.Sprintf("cc%d%d-", i, j), w.Port))
		}
	}
	load := startCitusLoad(ctx, clients, "load", members, citusValueOn(t, c, "pgquota.lease", "cjob", c.Workers()[1].Port))

	time.Sleep(1500 * time.Millisecond)
	c.Coordinator.Crash()
	time.Sleep(300 * time.Millisecond)
	c.Coordinator.Start()
	var recovered int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT recover_prepared_transactions()`, &recovered)
	t.Logf("recover_prepared_transactions() finished %d prepared transactions", recovered)
	time.Sleep(2 * time.Second)
	load.finish()
	for _, w := range c.Workers() {
		var prepared int
		w.QueryValue(cituscluster.Database, `SELECT count(*) FROM pg_prepared_xacts`, &prepared)
		require.Zero(t, prepared, "worker %d: no prepared transaction left", w.Port)
	}
	load.checkCounters(t, a, 400)
	load.checkFence(t, a)
}
