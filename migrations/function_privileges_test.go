package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// pinnedSearchPath is the search_path every allowlisted function runs with.
const pinnedSearchPath = "search_path=pg_catalog, pgquota, pg_temp"

// functionPrivilegeFaults lists every function of schema pgquota that
// PUBLIC or a pgquota role may execute without its row in
// pgquota.function_grant (membership counts: pgquota_operator runs what
// pgquota_app and pgquota_relay run), and every allowlisted function that
// is missing, not SECURITY DEFINER or without the pinned search_path.
func functionPrivilegeFaults(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		WITH fn AS (
			SELECT p.oid, p.oid::regprocedure::text AS sig, p.prosecdef, coalesce(p.proconfig, '{}') AS config,
			       coalesce(p.proacl, acldefault('f', p.proowner)) AS acl
			FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'pgquota'::regnamespace
		), allowed AS (
			SELECT g.function, g.role, g.definer FROM pgquota.function_grant g
		), roles AS (
			SELECT unnest(ARRAY['pgquota_app', 'pgquota_relay', 'pgquota_operator'])::name AS role
		)
		SELECT format('%s is executable by PUBLIC', fn.sig)
		FROM fn, aclexplode(fn.acl) a
		WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'
		UNION ALL
		SELECT format('%s is executable by %s without an allowlist row', fn.sig, r.role)
		FROM fn, roles r
		WHERE to_regrole(r.role) IS NOT NULL
		  AND has_function_privilege(r.role, fn.oid, 'EXECUTE')
		  AND NOT EXISTS (
			SELECT 1 FROM allowed g
			WHERE to_regprocedure(g.function) = fn.oid AND pg_has_role(r.role, g.role, 'MEMBER'))
		UNION ALL
		SELECT format('%s is on the allowlist for %s but does not exist', g.function, g.role)
		FROM allowed g WHERE to_regprocedure(g.function) IS NULL
		UNION ALL
		SELECT format('%s is on the allowlist but is not SECURITY DEFINER', fn.sig)
		FROM fn WHERE NOT fn.prosecdef AND EXISTS (SELECT 1 FROM allowed g WHERE to_regprocedure(g.function) = fn.oid AND g.definer)
		UNION ALL
		SELECT format('%s is on the allowlist as running as its caller but is SECURITY DEFINER', fn.sig)
		FROM fn WHERE fn.prosecdef AND EXISTS (SELECT 1 FROM allowed g WHERE to_regprocedure(g.function) = fn.oid AND NOT g.definer)
		UNION ALL
		SELECT format('%s is on the allowlist but its search_path is not pinned (%s)', fn.sig, fn.config)
		FROM fn WHERE NOT ($1 = ANY (fn.config)) AND EXISTS (SELECT 1 FROM allowed g WHERE to_regprocedure(g.function) = fn.oid)
		ORDER BY 1`, pinnedSearchPath)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// After every migration, no function of schema pgquota is executable by
// PUBLIC, and pgquota_app, pgquota_relay and pgquota_operator execute
// exactly their allowlist (pgquota.function_grant), each entry SECURITY
// DEFINER with search_path pinned. A later migration that forgets (a new
// function PUBLIC may execute, a CREATE OR REPLACE that resets SECURITY
// DEFINER) is reported.
func TestEveryExecutableFunctionIsAllowlistedDefiner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := pgtest.ConnectOwner(t, pgtest.NewURL(t), 2)
	require.Empty(t, functionPrivilegeFaults(t, owner))

	var n int
	require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM pgquota.function_grant`).Scan(&n))
	require.Greater(t, n, 40)
	// Internal helpers are executable by none of the roles.
	for _, fn := range []string{"pgquota.fence_admit(text,bigint,text)", "pgquota.next_lease_token()",
		"pgquota.grant_counter(text,text,bigint,text,bigint,timestamp with time zone,timestamp with time zone,timestamp with time zone)",
		"pgquota.greedy_take(bigint,bigint[],bigint[],bigint)", "pgquota.grant_roles()", "pgquota.grant_app(name)"} {
		for _, role := range []string{migrations.AppRole, migrations.RelayRole, migrations.OperatorRole} {
			var can bool
			require.NoError(t, owner.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, role, fn).Scan(&can))
			require.False(t, can, "%s may execute %s", role, fn)
		}
	}

	// What a later migration could forget.
	_, err := owner.Exec(ctx, `CREATE FUNCTION pgquota.later_helper() RETURNS int LANGUAGE sql AS 'SELECT 1'`)
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `ALTER FUNCTION pgquota.limit_usage(text, text) SECURITY INVOKER RESET search_path`)
	require.NoError(t, err)
	require.Equal(t, []string{
		"pgquota.later_helper() is executable by PUBLIC",
		"pgquota.later_helper() is executable by pgquota_app without an allowlist row",
		"pgquota.later_helper() is executable by pgquota_operator without an allowlist row",
		"pgquota.later_helper() is executable by pgquota_relay without an allowlist row",
		"pgquota.limit_usage(text,text) is on the allowlist but is not SECURITY DEFINER",
		"pgquota.limit_usage(text,text) is on the allowlist but its search_path is not pinned ({})",
	}, functionPrivilegeFaults(t, owner))
	// pgquota.grant_roles(), which a migration ends with, repairs both.
	_, err = owner.Exec(ctx, `SELECT pgquota.grant_roles()`)
	require.NoError(t, err)
	require.Empty(t, functionPrivilegeFaults(t, owner))
}

// A database migrated to 00017, with the application's role connected and
// calling, upgrades with one `migrate up` (migrations.Up): its quotas,
// counters and leases are kept, the same connections go on making calls,
// and the writes by hand that the role could make before are refused.
func TestUpgradeFrom00017WithAppRoleInUse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := pgtest.NewEmptyURL(t)
	owner := pgtest.ConnectOwner(t, dbURL, 2)
	db := openOwnerDB(t, dbURL)
	require.NoError(t, migrations.EnsureSchema(ctx, db))
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 17)
	require.NoError(t, err)

	// The application of the old build, as pgquota_app: it defines a
	// quota, grants through the SQL interface, and may rewrite a counter by
	// hand (the tamper).
	app := pgtest.Connect(t, pgtest.AppURL(t, dbURL), 2)
	_, err = app.Exec(ctx, `INSERT INTO pgquota.quota (name, window_unit, time_zone, default_limit) VALUES ('q', 'day', 'UTC', 5)`)
	require.NoError(t, err)
	var granted bool
	require.NoError(t, app.QueryRow(ctx, `SELECT granted FROM pgquota.grant('q', 'm', 3)`).Scan(&granted))
	require.True(t, granted)
	_, err = app.Exec(ctx, `UPDATE pgquota.usage SET used = used`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	var version int64
	require.NoError(t, owner.QueryRow(ctx, `SELECT max(version_id) FROM `+migrations.VersionTable+` WHERE is_applied`).Scan(&version))
	require.Equal(t, migrations.Latest(), version)

	// The same pool (its connections opened before the upgrade) goes on
	// with this build.
	client, err := quota.New(app, nil)
	require.NoError(t, err)
	require.NoError(t, client.CheckSchema(ctx))
	u, err := client.Usage(ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(3), u.Used)
	g, err := client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3})
	require.NoError(t, err)
	require.False(t, g.Granted, "3 + 3 > 5")
	leases, err := lease.New(client)
	require.NoError(t, err)
	l, err := leases.Acquire(ctx, lease.AcquireRequest{Name: "l", Holder: "h", TTL: time.Minute})
	require.NoError(t, err)
	l2, err := leases.Renew(ctx, lease.Lease{Name: "l", Token: l.Token}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, l.Token, l2.Token)
	_, err = leases.Release(ctx, lease.Lease{Name: "l", Token: l.Token})
	require.NoError(t, err)
	_, err = app.Exec(ctx, `UPDATE pgquota.usage SET used = 0`)
	require.Equal(t, "42501", pgErrCode(err))
	_, err = client.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(500))})
	require.ErrorIs(t, err, quota.ErrPermissionDenied)
	require.Empty(t, functionPrivilegeFaults(t, owner))
}

// openOwnerDB opens a database/sql handle on dbURL as its owner, whatever
// PGQUOTA_TEST_APP_ROLE says.
func openOwnerDB(t *testing.T, dbURL string) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(pgtest.ConnectOwner(t, dbURL, 2))
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func pgErrCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func ptr[T any](v T) *T { return &v }
