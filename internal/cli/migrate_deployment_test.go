package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// versionTableOf names the table that holds pgquota's migration versions
// in the database pool is on.
func versionTableOf(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var name string
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT coalesce(to_regclass('pgquota.pgquota_migrations'), to_regclass('pgquota.goose_db_version'))::text`).Scan(&name))
	require.NotEmpty(t, name)
	return name
}

// runFor runs a command against dbURL with its own deadline.
func runFor(d time.Duration, dbURL string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := cli.Run(ctx, append([]string{"--database-url", dbURL}, args...), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// Eight `pgquota migrate up` at once on an empty database all exit 0 and
// leave the schema a single run leaves, round after round.
func TestConcurrentMigrateUpCommands(t *testing.T) {
	t.Parallel()
	const rounds, runs = 10, 8
	single := pgtest.NewEmptyURL(t)
	ok(t, single, "migrate", "up")
	want := pgtest.SchemaSnapshot(t, pgtest.Connect(t, single, 1), migrations.Schema)

	differing, failed := 0, 0
	var report []string
	for round := range rounds {
		dbURL := pgtest.NewEmptyURL(t)
		res := make([]result, runs)
		var wg sync.WaitGroup
		for i := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = runFor(time.Minute, dbURL, "migrate", "up")
			}()
		}
		wg.Wait()
		for i, r := range res {
			if r.code != cli.ExitOK {
				failed++
				report = append(report, fmt.Sprintf("round %d run %d: exit %d: %s", round, i, r.code, r.stderr))
			}
		}
		pool := newCheckPool(t, dbURL)
		got := pgtest.SchemaSnapshot(t, pool, migrations.Schema)
		pool.Close()
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			differing++
			report = append(report, fmt.Sprintf("round %d: schema differs from a single run:\n%s", round, strings.Join(got, "\n")))
		}
	}
	t.Logf("%d rounds of %d concurrent `migrate up`: %d with a schema unlike a single run's, %d failed runs", rounds, runs, differing, failed)
	require.Zero(t, differing+failed, strings.Join(report, "\n"))
}

// newCheckPool opens a one-connection pool the caller closes.
func newCheckPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	return pool
}

// `migrate status` and `migrate version` only read: they answer at once
// while another process migrates (here: a `migrate up` that holds the
// migration lock and waits for a table lock), where they used to wait for
// the migration lock (10.7 s, up to 5 minutes).
func TestMigrateStatusAndVersionDoNotWaitForMigrationLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	pool := pgtest.Connect(t, dbURL, 2)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.EnsureSchema(ctx, db))
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 4)
	require.NoError(t, err)

	// Migration 5 alters pgquota.voucher_pool: hold a lock on it so that
	// `migrate up` stops there, holding the migration lock.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE pgquota.voucher_pool IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	upDone := make(chan result, 1)
	go func() { upDone <- runFor(time.Minute, dbURL, "migrate", "up") }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			               WHERE datname = current_database() AND wait_event_type = 'Lock'
			                 AND query ILIKE '%voucher_pool%')`).Scan(&waiting))
		return waiting
	}, 20*time.Second, 20*time.Millisecond, "migrate up never reached migration 5")

	start := time.Now()
	st := runFor(5*time.Second, dbURL, "migrate", "status")
	require.Equal(t, cli.ExitOK, st.code, "status while migrating: %q", st.stderr)
	require.Regexp(t, `(?m)^4\s+00004_ledger.sql\s+\d{4}-`, st.stdout)
	require.Regexp(t, `(?m)^5\s+00005_hotrow.sql\s+pending$`, st.stdout)
	v := runFor(5*time.Second, dbURL, "migrate", "version")
	require.Equal(t, cli.ExitOK, v.code, "version while migrating: %q", v.stderr)
	require.Regexp(t, `(?m)^version\s+4$`, v.stdout)
	t.Logf("status and version answered in %s while a migration held the lock", time.Since(start).Round(time.Millisecond))

	require.NoError(t, tx.Rollback(ctx))
	up := <-upDone
	require.Equal(t, cli.ExitOK, up.code, "stderr %q", up.stderr)
	require.Regexp(t, `(?m)^version\s+`+strconv.FormatInt(migrations.Latest(), 10)+` \(`, up.stdout)
}

// A database with a migration this build does not know (a newer build
// migrated it): `migrate up` and `migrate status` fail and say to upgrade
// pgquota, where up exited 0 and status left the version out.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)
	ok(t, dbURL, "migrate", "up")
	pool := pgtest.Connect(t, dbURL, 1)
	_, err := pool.Exec(context.Background(), `INSERT INTO `+versionTableOf(t, pool)+` (version_id, is_applied) VALUES (99, true)`)
	require.NoError(t, err)

	latest := strconv.FormatInt(migrations.Latest(), 10)
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "status"}} {
		requireError(t, runDB(t, dbURL, args...), cli.ExitError,
			"newer than this build", "99", latest, "upgrade pgquota")
	}
	r := runDB(t, dbURL, "migrate", "version")
	require.Equal(t, cli.ExitOK, r.code, "version still answers: %q", r.stderr)
	require.Regexp(t, `(?m)^version\s+99$`, r.stdout)
}

// A database that misses a version below its newest one (applied out of
// order, or a row removed): `migrate up` and `migrate status` fail, naming
// the missing version and the way forward, `migrate up --allow-missing`,
// which applies it.
func TestMigrateRefusesGapAndAllowMissingFillsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	pool := pgtest.Connect(t, dbURL, 2)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.EnsureSchema(ctx, db))
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 3)
	require.NoError(t, err)
	_, err = p.ApplyVersion(ctx, 5, true)
	require.NoError(t, err)

	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "status"}} {
		requireError(t, runDB(t, dbURL, args...), cli.ExitError,
			"version 4", "not applied", "pgquota migrate up --allow-missing")
	}
	requireError(t, runDB(t, dbURL, "quota", "list"), cli.ExitError, "version 4", "--allow-missing")

	out := ok(t, dbURL, "migrate", "up", "--allow-missing")
	require.Contains(t, out, "00004_ledger.sql")
	require.Regexp(t, `(?m)^version\s+`+strconv.FormatInt(migrations.Latest(), 10)+` \(`, out)
	out = ok(t, dbURL, "migrate", "status")
	require.NotContains(t, out, "pending")
	ok(t, dbURL, "quota", "list")
}

// `pgquota migrate grant-app --role R` is the documented way to set up an
// application role: run by a role that may grant membership, R (a plain
// LOGIN role) can then make the API's calls and read the schema version,
// but neither define (an operator command, refused naming pgquota_operator
// until `migrate grant-operator --role R`) nor migrate; run by the schema's owner without CREATEROLE, it fails at once
// saying who can grant the membership.
func TestMigrateGrantAppSetsUpApplicationRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	ok(t, dbURL, "migrate", "up")

	admin, err := pgxpool.New(ctx, pgtest.BaseURL(t))
	require.NoError(t, err)
	defer admin.Close()
	role := fmt.Sprintf("pgquota_cli_app_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'x'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP ROLE `+role) })

	// The owner (pgtestdb's role, no CREATEROLE) may grant privileges on
	// its objects but not membership in pgquota_app.
	requireError(t, runDB(t, dbURL, "migrate", "grant-app", "--role", role), cli.ExitError,
		"SQLSTATE 42501", "CREATEROLE", `GRANT pgquota_app TO "`+role+`"`)
	requireError(t, runDB(t, dbURL, "migrate", "grant-app", "--role", "no_such_role_x"), cli.ExitError,
		`role "no_such_role_x" does not exist`)

	// Before it is a member, the role's `migrate status` fails at once (it
	// used to retry a lock write for about 5 minutes), naming the fix.
	appURL := withUserPassword(t, dbURL, role, "x")
	start := time.Now()
	requireError(t, runFor(30*time.Second, appURL, "migrate", "status"), cli.ExitError,
		"permission denied for schema pgquota", "SQLSTATE 42501", "pgquota migrate grant-app --role")
	// A retry would run into runFor's 30 s deadline: well below it, the
	// command failed at once (room for a machine at a load of 20).
	require.Less(t, time.Since(start), 20*time.Second)

	// A role with CREATEROLE (here the server's admin) on the same database.
	adminURL := withUser(t, dbURL, pgtest.BaseURL(t))
	out := ok(t, adminURL, "migrate", "grant-app", "--role", role)
	require.Contains(t, out, "member")
	ok(t, adminURL, "migrate", "grant-app", "--role", role) // idempotent

	// An operator command run as the application's role fails at once,
	// naming the operator role and the command that grants it.
	requireError(t, runFor(30*time.Second, appURL, "quota", "define", "--name", "q", "--window", "day", "--limit", "2"), cli.ExitError,
		"SQLSTATE 42501", "pgquota_operator", "pgquota migrate grant-operator --role")
	out = ok(t, adminURL, "migrate", "grant-operator", "--role", role)
	require.Contains(t, out, "member")
	ok(t, appURL, "quota", "define", "--name", "q", "--window", "day", "--limit", "2")
	ok(t, appURL, "grant", "--quota", "q", "--member", "m")
	out = ok(t, appURL, "migrate", "status")
	require.NotContains(t, out, "pending")
	// With nothing pending up has nothing to do; down needs the owner.
	out = ok(t, appURL, "migrate", "up")
	require.Contains(t, out, "no migrations to apply")
	requireError(t, runFor(30*time.Second, appURL, "migrate", "down"), cli.ExitError,
		"SQLSTATE 42501", "owner of schema pgquota")
}

// withUser returns dbURL's database with the user and password of other.
func withUser(t *testing.T, dbURL, other string) string {
	t.Helper()
	o, err := url.Parse(other)
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = o.User
	return u.String()
}

func withUserPassword(t *testing.T, dbURL, user, password string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.UserPassword(user, password)
	return u.String()
}
