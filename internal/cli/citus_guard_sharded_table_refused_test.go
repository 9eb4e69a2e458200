//go:build citus

package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// On a Citus coordinator, the fence guard attaches to a table on the
// coordinator (a plain table, a Citus local table) and refuses, naming the
// table and why, a distributed or a reference table, whose rows live in
// workers' shards where the guard's trigger cannot see the token the
// transaction presented; the refused table gets no trigger. A guarded
// table cannot be distributed afterwards (Citus refuses a table with
// triggers).
func TestCitusGuardTableRefusesDistributedAndReferenceTables(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	c.Exec(`CREATE TABLE public.dist (id int PRIMARY KEY, fence_token bigint);
		SELECT create_distributed_table('public.dist', 'id');
		CREATE TABLE public.ref (id int PRIMARY KEY, fence_token bigint);
		SELECT create_reference_table('public.ref');
		CREATE TABLE public.local_citus (id int PRIMARY KEY, fence_token bigint);
		SELECT citus_add_local_table_to_metadata('public.local_citus');
		CREATE TABLE public.plain (id int PRIMARY KEY, fence_token bigint)`)
	qc, err := quota.New(c.Pool(), nil)
	require.NoError(t, err)
	fc, err := fence.New(qc)
	require.NoError(t, err)

	for table, kind := range map[string]string{"public.dist": "distributed", "public.ref": "reference"} {
		_, err := fc.GuardTable(ctx, fence.GuardTableRequest{Table: table, Column: "fence_token"})
		require.ErrorIs(t, err, quota.ErrInvalidInput, table)
		require.ErrorContains(t, err, table+" is a Citus "+kind+" table")
		var triggers int
		require.NoError(t, c.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname LIKE 'pgquota%'`, table).Scan(&triggers))
		require.Zero(t, triggers, "%s got no trigger", table)
		r := runDB(t, c.URL(), "fence", "guard", "--table", table, "--column", "fence_token")
		requireError(t, r, cli.ExitUsage, "is a Citus "+kind+" table")
	}
	for _, table := range []string{"public.local_citus", "public.plain"} {
		g, err := fc.GuardTable(ctx, fence.GuardTableRequest{Table: table, Column: "fence_token"})
		require.NoError(t, err, table)
		require.Equal(t, table, g.Resource)
	}
	_, err = c.Pool().Exec(ctx, `SELECT create_distributed_table('public.plain', 'id')`)
	require.ErrorContains(t, err, "has triggers", "Citus refuses to distribute a guarded table")
	require.NoError(t, fc.CheckGuards(ctx), "the guards still fire")
}
