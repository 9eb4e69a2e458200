package migrations_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/calltest"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

// connectWithSearchPath opens a pool on dbURL whose sessions run with
// search_path set to path, closed when the test ends.
func connectWithSearchPath(t *testing.T, dbURL, path string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["search_path"] = path
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// An application whose sessions run with search_path = pgquota, public and
// that migrates with its own goose (default table name, unqualified) keeps
// its own history beside pgquota's: no pgquota object is found under the
// names goose uses by default (pgquota's version table was
// pgquota.goose_db_version, which the application's goose took for its own
// and so applied none of its migrations).
func TestApplicationGooseWithPgquotaOnSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	_, err := migrations.Up(ctx, openDB(t, dbURL, 2))
	require.NoError(t, err)

	appDB := stdlib.OpenDBFromPool(connectWithSearchPath(t, dbURL, "pgquota, public"))
	t.Cleanup(func() { _ = appDB.Close() })
	appFS := fstest.MapFS{
		"00001_app.sql": {Data: []byte("-- +goose Up\nCREATE TABLE public.app_thing (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE public.app_thing;\n")},
		"00002_app.sql": {Data: []byte("-- +goose Up\nINSERT INTO public.app_thing VALUES (1);\n-- +goose Down\nDELETE FROM public.app_thing;\n")},
	}
	app, err := goose.NewProvider(goose.DialectPostgres, appDB, appFS, goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	res, err := app.Up(ctx)
	require.NoError(t, err)
	require.Len(t, res, 2, "the application's goose applies its own migrations")
	v, err := app.GetDBVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), v)

	// pgquota's history is untouched and complete; migrating again is a
	// no-op, and the schema works.
	db := openDB(t, dbURL, 2)
	require.Equal(t, allOnce(), appliedVersions(t, db))
	res, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Empty(t, res)
	client, err := quota.New(pgtest.Connect(t, dbURL, 2), nil)
	require.NoError(t, err)
	require.NoError(t, client.CheckSchema(ctx))

	// The application rolls back without touching pgquota.
	_, err = app.DownTo(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, allOnce(), appliedVersions(t, db))
	require.NoError(t, client.CheckSchema(ctx))
}

// Every object reference in the migrations and in the statements pgquota
// runs is schema-qualified: migrating and running calls on sessions whose
// search_path is empty works (an unqualified reference to a pgquota table,
// type or function would fail with 42P01, 42704 or 42883; built-ins are
// always found in pg_catalog).
func TestNothingResolvedThroughSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	pool := connectWithSearchPath(t, dbURL, `""`)
	var path string
	require.NoError(t, pool.QueryRow(ctx, `SHOW search_path`).Scan(&path))
	require.Equal(t, `""`, path)

	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, client.Migrate(ctx))
	require.NoError(t, client.CheckSchema(ctx))
	calltest.Exercise(t, client, "sp_")

	var db *sql.DB = stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 0)
	require.NoError(t, err, "every Down runs without a search_path too")
}
