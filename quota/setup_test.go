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
	ctx context.Context
	// pool and client are the application's: as pgtest.AppLogin under
	// PGQUOTA_TEST_APP_ROLE=1.
	pool   *pgxpool.Pool
	client *quota.Client
	// operator is the client for operator work (DefineQuota,
	// SetMemberLimit, CreateCampaign, ImportCodes, BumpLeaseEpoch,
	// ReapLeases, ReapLedger and the like; see operatorOf): client itself
	// in the normal pass, a client as pgtest.OperatorLogin under
	// PGQUOTA_TEST_APP_ROLE=1.
	operator *quota.Client
	// owner is a pool on the same database as its owner: for the DDL a
	// test runs on purpose (pinning pgquota.clock, say), which the
	// application role of PGQUOTA_TEST_APP_ROLE=1 may not run.
	owner *pgxpool.Pool
}

// setup returns a client on a fresh migrated database whose pool holds at
// most maxConns connections (0 for the harness default). Under
// PGQUOTA_TEST_POOLER the pool goes through PgBouncer in transaction mode
// and the client is configured for it (testConfig).
func setup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), maxConns)
	client, err := quota.New(pool, testConfig(t, nil))
	require.NoError(t, err)
	return &testBundle{ctx: context.Background(), pool: pool, client: client, operator: operatorOf(t, client), owner: pgtest.ConnectOwner(t, dbURL, 2)}
}

// roleConns bounds the pools operatorOf and relayOf open under
// PGQUOTA_TEST_APP_ROLE=1: operator work is one call at a time, and a
// test's relays are few.
const roleConns = 2

// operatorOf returns the client that operator work on c's database goes
// through (the functions of the 'pgquota_operator' rows of
// pgquota.function_grant: DefineQuota, SetMemberLimit, ClearMemberLimit,
// CreateCampaign, CreateShardedCampaign, ImportCodes, BumpLeaseEpoch,
// GuardTable, ReapLeases, ReapLedger and their Tx variants). In the normal
// pass that is c itself, so the pass keeps its meaning; under
// PGQUOTA_TEST_APP_ROLE=1, where c's pool connects as the application
// role, it is a new client (testConfig) on a pool of roleConns connections
// to the same database (c's pool's URL) as pgtest.OperatorLogin, closed
// when t ends. A *Tx variant's transaction must come from its Pool().
func operatorOf(t testing.TB, c *quota.Client) *quota.Client {
	t.Helper()
	return roleClient(t, c, pgtest.ConnectOperator, nil, roleConns)
}

// relayOf is operatorOf for the relay's work (NewRelay, ReapOutbox: the
// 'pgquota_relay' rows), as pgtest.RelayLogin under
// PGQUOTA_TEST_APP_ROLE=1.
func relayOf(t testing.TB, c *quota.Client) *quota.Client {
	t.Helper()
	return roleClient(t, c, pgtest.ConnectRelay, nil, roleConns)
}

// relayWith is relayOf with the relay client's config (cfg goes through
// testConfig) and its pool's size under PGQUOTA_TEST_APP_ROLE=1; c itself
// in the normal pass, which must then have been made with cfg.
func relayWith(t testing.TB, c *quota.Client, cfg *quota.Config, maxConns int32) *quota.Client {
	t.Helper()
	return roleClient(t, c, pgtest.ConnectRelay, cfg, maxConns)
}

func roleClient(t testing.TB, c *quota.Client, connect func(testing.TB, string, int32) *pgxpool.Pool, cfg *quota.Config, maxConns int32) *quota.Client {
	t.Helper()
	if !pgtest.AppRoleMode() {
		return c
	}
	rc, err := quota.New(connect(t, c.Pool().Config().ConnString(), maxConns), testConfig(t, cfg))
	if err != nil {
		t.Fatalf("a client for the role's work under %s=1: %v", pgtest.EnvAppRole, err)
	}
	return rc
}

// testConfig returns cfg (nil for the defaults) with Pooler set to
// PoolerTransaction when the test's pools go through a transaction pooler
// (pgtest.Pooled).
func testConfig(t testing.TB, cfg *quota.Config) *quota.Config {
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

// ownerClient returns a client on the owner pool, for calls that run DDL
// on purpose (GuardTable creates a trigger on an application table).
func (b *testBundle) ownerClient(t *testing.T) *quota.Client {
	t.Helper()
	c, err := quota.New(b.owner, nil)
	require.NoError(t, err)
	return c
}

// appDDL runs DDL an application would run as the owner of its own
// tables (on purpose: the role of PGQUOTA_TEST_APP_ROLE=1 may not), then
// gives b.pool's role the use of schemas and tables, as an application's
// own role would have.
func (b *testBundle) appDDL(t *testing.T, ddl string, schemas []string, tables ...string) {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, ddl)
	require.NoError(t, err)
	var role string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT quote_ident(current_user)`).Scan(&role))
	for _, s := range schemas {
		_, err := b.owner.Exec(b.ctx, `GRANT USAGE ON SCHEMA `+s+` TO `+role)
		require.NoError(t, err)
	}
	for _, tb := range tables {
		_, err := b.owner.Exec(b.ctx, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON `+tb+` TO `+role)
		require.NoError(t, err)
	}
}

// define defines a quota or fails the test.
func (b *testBundle) define(t *testing.T, d quota.Definition) quota.Quota {
	t.Helper()
	q, err := b.operator.DefineQuota(b.ctx, d)
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
	_, err := b.owner.Exec(b.ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT '`+at+`'::timestamptz $$`)
	require.NoError(t, err)
}
