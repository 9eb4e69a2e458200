package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// Every table of schema pgquota has a replica identity (a primary key, a
// REPLICA IDENTITY USING INDEX or FULL), so that logical replication can
// move it: a Citus rebalance onto an added worker refuses a table without
// one (internal/cli/citus_rebalance_under_load_test.go runs that
// rebalance), and a table added by a later migration without a key fails
// here first.
func TestEveryTableHasAReplicaIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, pgtest.NewEmptyURL(t), 2)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)

	rows, err := db.QueryContext(ctx, `SELECT c.relname FROM pg_class c
		WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
		  AND c.relreplident <> 'f'
		  AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
		                  AND (i.indisreplident OR (c.relreplident = 'd' AND i.indisprimary)))
		ORDER BY 1`, migrations.Schema)
	require.NoError(t, err)
	defer rows.Close()
	var without []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		without = append(without, name)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, without, "tables of schema %s without a replica identity", migrations.Schema)

	var tables int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_class
		WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p')`, migrations.Schema).Scan(&tables))
	require.Greater(t, tables, 20, "the query saw pgquota's tables")
}
