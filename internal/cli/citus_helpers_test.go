//go:build citus

package cli_test

import (
	"strconv"
	"testing"

	"github.com/pgquota/pgquota/internal/cituscluster"
)

// citusValueOn returns the first of prefix0, prefix1, ... whose shard of
// the distributed table is placed on the worker listening on port, as the
// coordinator's metadata says.
func citusValueOn(t *testing.T, c *cituscluster.Cluster, table, prefix string, port int) string {
	t.Helper()
	for i := range 1000 {
		v := prefix + strconv.Itoa(i)
		var p int
		c.Coordinator.QueryValue(cituscluster.Database, `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column($1::regclass, $2::text)`, &p, table, v)
		if p == port {
			return v
		}
	}
	t.Fatalf("no %s value with prefix %q on the worker at port %d", table, prefix, port)
	return ""
}
