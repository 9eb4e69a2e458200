package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// UpPool migrates an empty database through a *pgxpool.Pool (each
// migration once, to the latest version), applies nothing the second
// time, and leaves the pool open.
func TestUpPoolMigratesThroughAPgxPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Connect(t, pgtest.NewEmptyURL(t), 1)
	res, err := migrations.UpPool(ctx, pool)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	require.Equal(t, allOnce(), appliedVersions(t, db))
	st, err := migrations.ReadState(ctx, db)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), st.Current)

	res, err = migrations.UpPool(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, res, "nothing left to apply")
	require.NoError(t, pool.Ping(ctx), "the pool stays open")
}
