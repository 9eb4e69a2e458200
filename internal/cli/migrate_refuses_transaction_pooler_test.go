package cli_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgbouncer"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// migrate up and down with PGQUOTA_POOLER=transaction (or --pooler
// transaction), through a real PgBouncer in transaction mode, are refused
// before they connect, naming the setting and why (the migration lock
// needs a session), where four concurrent runs raced and one failed with
// 23505 on pg_proc. Nothing is created.
func TestMigrateRefusesTransactionPooler(t *testing.T) {
	// t.Setenv: not parallel.
	ctx := context.Background()
	b := pgbouncer.Start(t, pgtest.BaseURL(t), pgbouncer.Options{})
	dbURL := pgtest.NewEmptyURL(t)
	pooled, err := b.URL(dbURL)
	require.NoError(t, err)

	t.Setenv(quota.EnvPooler, "transaction")
	var wg sync.WaitGroup
	results := make([]result, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, "--database-url", pooled, "migrate", "up")
		}()
	}
	wg.Wait()
	for _, r := range results {
		requireError(t, r, cli.ExitUsage, "migrate up refuses $PGQUOTA_POOLER=transaction", "session-level advisory lock", "direct connection")
	}
	requireError(t, run(t, "--database-url", pooled, "migrate", "down"), cli.ExitUsage, "migrate down refuses $PGQUOTA_POOLER=transaction")
	requireError(t, run(t, "--database-url", pooled, "--pooler", "transaction", "migrate", "up"), cli.ExitUsage, "migrate up refuses --pooler=transaction")

	var schemas int
	require.NoError(t, pgtest.ConnectOwner(t, dbURL, 1).QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgquota'`).Scan(&schemas))
	require.Zero(t, schemas, "nothing created")

	// The library refuses the same way.
	client, err := quota.New(pgtest.ConnectOwner(t, pooled+"&default_query_exec_mode=exec", 1), &quota.Config{Pooler: quota.PoolerTransaction})
	require.NoError(t, err)
	err = client.Migrate(ctx)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.ErrorContains(t, err, "Config.Pooler")
	require.ErrorContains(t, err, "session-level advisory lock")

	// Without the setting, through a direct connection, it migrates.
	t.Setenv(quota.EnvPooler, "")
	ok(t, dbURL, "migrate", "up")
}
