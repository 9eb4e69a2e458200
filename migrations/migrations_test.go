package migrations_test

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// openDB opens a database/sql handle on a fresh pool of at most maxConns
// connections to dbURL, closed when the test ends.
func openDB(t *testing.T, dbURL string, maxConns int32) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(pgtest.Connect(t, dbURL, maxConns))
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// appliedVersions returns how often each version appears as applied in
// pgquota's goose table (version 0 is goose's own bootstrap row).
func appliedVersions(t *testing.T, db *sql.DB) map[int64]int {
	t.Helper()
	rows, err := db.Query(`SELECT version_id, count(*) FROM ` + migrations.VersionTable + ` WHERE is_applied AND version_id > 0 GROUP BY version_id`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var v int64
		var n int
		require.NoError(t, rows.Scan(&v, &n))
		out[v] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// allOnce is what appliedVersions returns when every migration is applied
// exactly once.
func allOnce() map[int64]int {
	out := map[int64]int{}
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		panic(err)
	}
	for _, name := range names {
		v, err := goose.NumericComponent(name)
		if err != nil {
			panic(err)
		}
		out[v] = 1
	}
	return out
}

// relations lists the tables, functions and sequences in schema.
func relations(t *testing.T, db *sql.DB, schema string) []string {
	t.Helper()
	return queryStrings(t, db, `
		SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'table ' END || relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'S')
		UNION ALL
		SELECT 'function ' || proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1
		ORDER BY 1`, schema)
}

// queryStrings runs q on db and returns its one text column, row by row.
func queryStrings(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), q, args...)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestLatest(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	name := regexp.MustCompile(`^(\d{5})_[a-z0-9_]+\.sql$`)
	var newest int64
	files := 0
	for _, e := range entries {
		if e.IsDir() || !regexp.MustCompile(`\.sql$`).MatchString(e.Name()) {
			continue
		}
		m := name.FindStringSubmatch(e.Name())
		require.NotNil(t, m, "%s: migration files are named 00001_name.sql (zero-padded, lower case)", e.Name())
		v, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		newest = max(newest, v)
		files++
	}
	require.Positive(t, files)
	require.Equal(t, newest, migrations.Latest())
	require.LessOrEqual(t, int64(files), newest, "versions are distinct")

	// The embedded files are the ones on disk.
	for _, e := range entries {
		if name.MatchString(e.Name()) {
			onDisk, err := os.ReadFile(e.Name())
			require.NoError(t, err)
			embedded, err := migrations.FS.ReadFile(e.Name())
			require.NoError(t, err)
			require.Equal(t, onDisk, embedded)
		}
	}
}

// Replicas that migrate an empty database at once all succeed, and each
// migration is applied exactly once.
func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)
	const replicas = 4
	ctx := context.Background()

	applied := make([]int, replicas)
	errs := make([]error, replicas)
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(replicas)
	for i := range replicas {
		// Each replica has its own pool, as separate processes would.
		pool := pgtest.Connect(t, dbURL, 2)
		db := openDB(t, dbURL, 2)
		go func() {
			defer done.Done()
			start.Wait()
			if i%2 == 0 {
				res, err := migrations.Up(ctx, db)
				applied[i], errs[i] = len(res), err
				return
			}
			client, err := quota.New(pool, nil)
			if err == nil {
				err = client.Migrate(ctx)
			}
			errs[i] = err
			applied[i] = -1 // Client.Migrate does not report what it applied
		}()
	}
	start.Done()
	done.Wait()
	for i, err := range errs {
		require.NoError(t, err, "replica %d", i)
	}

	db := openDB(t, dbURL, 2)
	require.Equal(t, allOnce(), appliedVersions(t, db))
	// The migrations.Up replicas together applied at most every migration
	// once (the Client.Migrate ones may have applied some).
	sum := 0
	for _, n := range applied {
		if n > 0 {
			sum += n
		}
	}
	require.LessOrEqual(t, sum, len(allOnce()))

	// The schema works.
	client, err := quota.New(pgtest.Connect(t, dbURL, 2), nil)
	require.NoError(t, err)
	require.NoError(t, client.CheckSchema(ctx))

	// Migrating again is a no-op.
	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Empty(t, res)
	require.Equal(t, allOnce(), appliedVersions(t, db))
}

// Every migration's Down works: all the way down to 0, then up again.
func TestDownToZeroAndUpAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	db := openDB(t, dbURL, 2)

	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))
	migrated := relations(t, db, migrations.Schema)

	// Data in every table must not stop a down migration.
	client, err := quota.New(pgtest.Connect(t, dbURL, 2), nil)
	require.NoError(t, err)
	_, err = client.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: new(int64)})
	require.NoError(t, err)
	_, err = client.SetMemberLimit(ctx, "q", "m", 3)
	require.NoError(t, err)
	_, err = client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err)
	_, err = voucherOf(t, client).CreateCampaign(ctx, "p", 2)
	require.NoError(t, err)
	_, err = voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: "m"})
	require.NoError(t, err)
	_, err = voucherOf(t, client).ImportCodes(ctx, "c", []string{"a", "b"})
	require.NoError(t, err)
	_, err = voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "c", Member: "m"})
	require.NoError(t, err)

	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	down, err := p.DownTo(ctx, 0)
	require.NoError(t, err)
	require.Len(t, down, len(allOnce()))
	for i, r := range down {
		require.Equal(t, "down", r.Direction)
		if i == 0 {
			require.Equal(t, migrations.Latest(), r.Source.Version, "newest first")
		} else {
			require.Less(t, r.Source.Version, down[i-1].Source.Version, "newest first")
		}
	}
	v, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	require.Zero(t, v)
	// Only goose's own tables are left in the schema.
	require.ElementsMatch(t, []string{"table pgquota_migrations", "sequence pgquota_migrations_id_seq"},
		relations(t, db, migrations.Schema))

	res, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))
	require.Equal(t, migrated, relations(t, db, migrations.Schema))
	require.NoError(t, client.CheckSchema(ctx))
	g, err := client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: new(int64)})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound, "down dropped the data")
	require.False(t, g.Granted)

	// One step at a time, both ways.
	for range allOnce() {
		_, err := p.Down(ctx)
		require.NoError(t, err)
	}
	for range allOnce() {
		_, err := p.UpByOne(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, migrated, relations(t, db, migrations.Schema))
}

// pgquota's goose table is pgquota.goose_db_version: an application that
// uses goose with its default table (public.goose_db_version) keeps its own
// history, whichever migrates first.
func TestCoexistsWithApplicationGoose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, pgtest.NewEmptyURL(t), 2)

	appFS := fstest.MapFS{
		"00001_app.sql": {Data: []byte("-- +goose Up\nCREATE TABLE app_thing (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE app_thing;\n")},
		"00002_app.sql": {Data: []byte("-- +goose Up\nINSERT INTO app_thing VALUES (1);\n-- +goose Down\nDELETE FROM app_thing;\n")},
		"00003_app.sql": {Data: []byte("-- +goose Up\nINSERT INTO app_thing VALUES (2);\n-- +goose Down\nDELETE FROM app_thing WHERE id = 2;\n")},
	}
	app, err := goose.NewProvider(goose.DialectPostgres, db, appFS, goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = app.UpTo(ctx, 2)
	require.NoError(t, err)

	appHistory := func() []string {
		rows, err := db.QueryContext(ctx, `SELECT version_id || ':' || is_applied FROM public.goose_db_version ORDER BY id`)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	before := appHistory()
	require.Equal(t, []string{"0:true", "1:true", "2:true"}, before)

	// pgquota migrates: the application's history is untouched, and
	// pgquota's starts from nothing although a goose table with the default
	// name exists.
	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))
	require.Equal(t, before, appHistory())
	require.Equal(t, allOnce(), appliedVersions(t, db))

	// The application migrates on, and its status knows nothing of pgquota.
	_, err = app.Up(ctx)
	require.NoError(t, err)
	v, err := app.GetDBVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), v)
	require.Equal(t, allOnce(), appliedVersions(t, db))

	// pgquota down and up leave the application alone.
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"0:true", "1:true", "2:true", "3:true"}, appHistory())
	var things int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM app_thing`).Scan(&things))
	require.Equal(t, 2, things)
	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)

	// And the other order: pgquota first, the application's goose after.
	db2 := openDB(t, pgtest.NewEmptyURL(t), 2)
	_, err = migrations.Up(ctx, db2)
	require.NoError(t, err)
	app2, err := goose.NewProvider(goose.DialectPostgres, db2, appFS, goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	appRes, err := app2.Up(ctx)
	require.NoError(t, err)
	require.Len(t, appRes, 3, "the application's goose sees none of pgquota's versions as its own")
	require.Equal(t, allOnce(), appliedVersions(t, db2))
}

// The migrator creates its schema itself, also when several processes do it
// at once, and uses no session-level advisory lock (so it works behind a
// transaction-mode pooler).
func TestEnsureSchemaConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	const n = 8
	errs := make([]error, n)
	dbs := make([]*sql.DB, n)
	for i := range dbs {
		dbs[i] = openDB(t, dbURL, 1)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.EnsureSchema(ctx, dbs[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "caller %d", i)
	}
	var locks int
	require.NoError(t, dbs[0].QueryRowContext(ctx, `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks))
	require.Zero(t, locks, "no advisory lock outlives EnsureSchema")
}

// voucherOf returns a voucher client on c.
func voucherOf(t *testing.T, c *quota.Client) *voucher.Client {
	t.Helper()
	v, err := voucher.New(c, nil)
	require.NoError(t, err)
	return v
}
