package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgbouncer"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// A started PgBouncer pools in transaction mode with a pool of 3, routes
// any database of the server through its fallback entry, and finds a
// LISTEN left on a pooled server connection.
func TestStartTransactionMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pgbouncer.Start(t, pgtest.BaseURL(t), pgbouncer.Options{})
	u, err := b.URL(pgtest.NewEmptyURL(t) + "&default_query_exec_mode=exec")
	require.NoError(t, err)

	cfg, err := b.Show(ctx, "CONFIG")
	require.NoError(t, err)
	settings := map[string]string{}
	for _, r := range cfg {
		settings[r["key"]] = r["value"]
	}
	require.Equal(t, "transaction", settings["pool_mode"])
	require.Equal(t, "3", settings["default_pool_size"])

	chs, err := b.ServerChannels(ctx, u)
	require.NoError(t, err)
	require.Empty(t, chs)

	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "LISTEN left_behind")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	chs, err = b.ServerChannels(ctx, u)
	require.NoError(t, err)
	require.Equal(t, []string{"left_behind"}, chs, "LISTEN is session state: it stays on the server connection")
}
