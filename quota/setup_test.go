package quota_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	client *quota.Client
}

// setup returns a client on a fresh migrated database whose pool holds at
// most maxConns connections (0 for the harness default). Under
// PGQUOTA_TEST_POOLER the pool goes through PgBouncer in transaction mode
// and the client is configured for it (testConfig).
func setup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	pool := pgtest.NewPool(t, maxConns)
	client, err := quota.New(pool, testConfig(t, nil))
	require.NoError(t, err)
	return &testBundle{ctx: context.Background(), pool: pool, client: client}
}

// testConfig returns cfg (nil for the defaults) with Pooler set to
// PoolerTransaction when the test's pools go through a transaction pooler
// (pgtest.Pooled).
func testConfig(t *testing.T, cfg *quota.Config) *quota.Config {
	t.Helper()
	if !pgtest.Pooled(t) {
		return cfg
	}
	var c quota.Config
	if cfg != nil {
		c = *cfg
	}
	c.Pooler = quota.PoolerTransaction
	return &c
}

func ptr[T any](v T) *T { return &v }

// define defines a quota or fails the test.
func (b *testBundle) define(t *testing.T, d quota.Definition) quota.Quota {
	t.Helper()
	q, err := b.client.DefineQuota(b.ctx, d)
	require.NoError(t, err)
	return q
}

// usageRows returns the sum of used over every counter row of a quota and
// member, and the number of rows.
func (b *testBundle) usageRows(t *testing.T, quotaName, member string) (sum, rows int64) {
	t.Helper()
	err := b.pool.QueryRow(b.ctx, `
		SELECT coalesce(sum(used), 0), count(*) FROM pgquota.usage
		WHERE quota_name = $1 AND member = $2`, quotaName, member).Scan(&sum, &rows)
	require.NoError(t, err)
	return sum, rows
}

// countRows counts the rows of a pgquota table.
func (b *testBundle) countRows(t *testing.T, table string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.`+table).Scan(&n))
	return n
}

// setClock pins pgquota.clock() in this test's database to at.
func (b *testBundle) setClock(t *testing.T, at string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT '`+at+`'::timestamptz $$`)
	require.NoError(t, err)
}
