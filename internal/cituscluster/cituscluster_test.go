//go:build citus

// The Citus tests need citus.so (.ci/citus-build), which an ordinary
// PostgreSQL server does not have: they build with -tags citus only, in
// CI's Citus pass (.ci/run), so that `make test` stays green without it.

package cituscluster_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
)

type placement struct {
	Shard string
	Port  int
}

// placements lists table's shards and the worker port each is placed on,
// as the coordinator's metadata says (citus_shards, and pg_dist_placement
// joined with pg_dist_node), failing when the two disagree.
func placements(t *testing.T, c *cituscluster.Cluster, table string) []placement {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := c.Pool().Query(ctx, `SELECT shard_name::text, nodeport FROM citus_shards
		WHERE table_name = $1::regclass ORDER BY shardid`, table)
	require.NoError(t, err)
	fromView, err := pgx.CollectRows(rows, pgx.RowToStructByPos[placement])
	require.NoError(t, err)
	rows, err = c.Pool().Query(ctx, `SELECT shard_name(s.logicalrelid, s.shardid)::text, n.nodeport
		FROM pg_dist_shard s
		JOIN pg_dist_placement p USING (shardid)
		JOIN pg_dist_node n USING (groupid)
		WHERE s.logicalrelid = $1::regclass ORDER BY s.shardid`, table)
	require.NoError(t, err)
	fromCatalog, err := pgx.CollectRows(rows, pgx.RowToStructByPos[placement])
	require.NoError(t, err)
	require.Equal(t, fromCatalog, fromView, "citus_shards and pg_dist_placement agree")
	return fromView
}

// portsOf returns the distinct ports of ps, sorted.
func portsOf(ps []placement) []int {
	seen := map[int]bool{}
	var ports []int
	for _, p := range ps {
		if !seen[p.Port] {
			seen[p.Port] = true
			ports = append(ports, p.Port)
		}
	}
	sort.Ints(ports)
	return ports
}

// TestDistributedTableIsShardedOverBothWorkers proves that the cluster
// really distributes: a hash-distributed table's shards are placed on both
// workers, each worker holds some of the rows in its own shard tables, and
// the coordinator's query sees all of them.
func TestDistributedTableIsShardedOverBothWorkers(t *testing.T) {
	c := cituscluster.StartWith(t, 2, map[string]string{"citus.shard_count": "8"})
	workers := c.Workers()
	require.Len(t, workers, 2)
	require.Equal(t, []int{min(workers[0].Port, workers[1].Port), max(workers[0].Port, workers[1].Port)}, c.ActiveWorkers())

	var version string
	c.Coordinator.QueryValue(cituscluster.Database, "SELECT citus_version()", &version)
	t.Logf("%s", version)

	c.Exec(`CREATE TABLE items (id bigint PRIMARY KEY, note text NOT NULL);
		SELECT create_distributed_table('items', 'id');
		INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, 1000) g`)

	ps := placements(t, c, "items")
	require.Len(t, ps, 8, "citus.shard_count shards")
	require.Equal(t, c.ActiveWorkers(), portsOf(ps), "shards on both workers")

	// Each worker holds rows of its own shards; together, every row once.
	byPort := map[int]int{}
	for _, w := range workers {
		for _, p := range ps {
			if p.Port != w.Port {
				continue
			}
			var n int
			w.QueryValue(cituscluster.Database, "SELECT count(*)::int FROM "+pgx.Identifier{p.Shard}.Sanitize(), &n)
			byPort[w.Port] += n
		}
	}
	t.Logf("rows per worker port: %v", byPort)
	require.Len(t, byPort, 2)
	for port, n := range byPort {
		require.Positive(t, n, "worker on port %d holds rows", port)
	}
	require.Equal(t, 1000, byPort[workers[0].Port]+byPort[workers[1].Port])

	var n, sum int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT count(*), sum(id) FROM items").Scan(&n, &sum))
	require.Equal(t, int64(1000), n, "the coordinator sees every row")
	require.Equal(t, int64(1000*1001/2), sum)

	var plan string
	require.NoError(t, c.Pool().QueryRow(ctx, "EXPLAIN (COSTS OFF) SELECT note FROM items WHERE id = 7").Scan(&plan))
	require.Contains(t, plan, "Custom Scan (Citus Adaptive)", "the coordinator plans through Citus")
}

// TestAddWorkerTakesShardsOfTablesDistributedAfterwards shows what a later
// rebalance test builds on: AddWorker registers a third worker, and a table
// distributed after it has shards on all three.
func TestAddWorkerTakesShardsOfTablesDistributedAfterwards(t *testing.T) {
	c := cituscluster.StartWith(t, 2, map[string]string{"citus.shard_count": "6"})
	c.Exec("CREATE TABLE before_add (id int PRIMARY KEY); SELECT create_distributed_table('before_add', 'id')")
	w := c.AddWorker()
	require.Len(t, c.ActiveWorkers(), 3)
	require.Contains(t, c.ActiveWorkers(), w.Port)
	require.NotContains(t, portsOf(placements(t, c, "before_add")), w.Port, "no shard moves without a rebalance")

	c.Exec("CREATE TABLE after_add (id int PRIMARY KEY); SELECT create_distributed_table('after_add', 'id', colocate_with => 'none')")
	require.Equal(t, c.ActiveWorkers(), portsOf(placements(t, c, "after_add")))
}
