//go:build citus

package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
)

// On a Citus coordinator the lease epoch moves as on one server: `lease
// epoch bump` raises it (its Citus body reads the clock and the system
// identifier into variables: Citus refuses them in the UPDATE of the
// reference table pgquota.lease_epoch), and after the coordinator became
// another cluster (a restore or a failover: here its recorded system
// identifier no longer matches) the next acquisition records a new epoch
// and gets a token above every one before, where it failed before.
func TestCitusLeaseEpochMovesAndTokensStayIncreasing(t *testing.T) {
	c := cituscluster.Start(t, 2)
	db := c.URL()
	ok(t, db, "migrate", "up")
	epochOf := func(token int64) int64 { return token >> 40 }

	first := acquireJSON(t, db, "--name", "e1", "--holder", "h", "--ttl", "1m")
	ok(t, db, "lease", "epoch", "bump", "--no-standbys")
	bumped := acquireJSON(t, db, "--name", "e2", "--holder", "h", "--ttl", "1m")
	require.Greater(t, bumped, first)
	require.Greater(t, epochOf(bumped), epochOf(first), "the bump raised the epoch")

	// The coordinator as a restored copy would find it: another system
	// identifier recorded than its own.
	c.Exec(`UPDATE pgquota.lease_epoch SET system_identifier = 1`)
	moved := acquireJSON(t, db, "--name", "e3", "--holder", "h", "--ttl", "1m")
	require.Greater(t, moved, bumped, "the first token after the change is above every one before")
	require.Greater(t, epochOf(moved), epochOf(bumped))
	var sys int64
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT system_identifier FROM pgquota.lease_epoch`, &sys)
	require.NotEqual(t, int64(1), sys, "the acquisition recorded the coordinator's own identifier")
	next := acquireJSON(t, db, "--name", "e4", "--holder", "h", "--ttl", "1m")
	require.Greater(t, next, moved)
	require.Equal(t, epochOf(moved), epochOf(next), "no further move once recorded")
}
