//go:build citus

package scratch_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/internal/scratch"
	"github.com/pgquota/pgquota/quota"
)

// On a Citus coordinator, a scratch database (the bench's and the lab's)
// is a Citus database of its own: created on the coordinator and both
// workers, pgquota's tables distributed with shards on both workers, a
// grant decided there; Drop removes it from every node.
func TestCitusScratchDatabaseIsDistributedAndDroppedOnEveryNode(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ctx := t.Context()
	d, err := scratch.Create(ctx, c.Pool(), "pgquota_scratch")
	require.NoError(t, err)
	nodes := append([]*pgcluster.Cluster{c.Coordinator}, c.Workers()...)
	exists := func() []bool {
		var got []bool
		for _, n := range nodes {
			var has bool
			n.QueryValue("postgres", `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, &has, d.Name)
			got = append(got, has)
		}
		return got
	}
	require.Equal(t, []bool{true, true, true}, exists(), "the scratch database on the coordinator and both workers")

	pool, err := d.Pool(ctx, 4)
	require.NoError(t, err)
	var workers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT nodeport) FROM citus_shards
		WHERE table_name = 'pgquota.usage'::regclass`).Scan(&workers))
	require.Equal(t, 2, workers, "pgquota.usage has shards on both workers")
	qc, err := quota.New(pool, nil)
	require.NoError(t, err)
	_, err = qc.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: quota.Limit(1)})
	require.NoError(t, err)
	for i, want := range []bool{true, false} {
		res, err := qc.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
		require.NoError(t, err)
		require.Equal(t, want, res.Granted, "grant %d", i)
	}
	pool.Close()

	require.NoError(t, d.Drop(context.Background()))
	require.Equal(t, []bool{false, false, false}, exists(), "dropped on every node")
}
