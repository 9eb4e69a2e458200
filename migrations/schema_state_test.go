package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

// A database with a migration this build does not know (a newer build
// migrated it) is an error for Up (which applies nothing) and CheckSchema,
// where Up returned nil and CheckSchema accepted an unknown version below
// the newest; the message says to upgrade.
func TestNewerSchemaIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, unknown := range []int64{migrations.Latest() + 1, migrations.Latest() + 90} {
		dbURL := pgtest.NewEmptyURL(t)
		db := openDB(t, dbURL, 2)
		_, err := migrations.Up(ctx, db)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, `INSERT INTO `+migrations.VersionTable+` (version_id, is_applied) VALUES ($1, true)`, unknown)
		require.NoError(t, err)

		res, err := migrations.Up(ctx, db)
		require.ErrorIs(t, err, migrations.ErrSchemaNewer)
		require.ErrorIs(t, err, quota.ErrSchemaNewer)
		require.Empty(t, res)
		var se *migrations.SchemaError
		require.ErrorAs(t, err, &se)
		require.Equal(t, []int64{unknown}, se.Unknown)
		require.Contains(t, err.Error(), "newer than this build")
		require.Contains(t, err.Error(), "upgrade pgquota")

		client, err := quota.New(pgtest.Connect(t, dbURL, 1), nil)
		require.NoError(t, err)
		err = client.CheckSchema(ctx)
		require.ErrorIs(t, err, quota.ErrSchemaNewer)
		require.NotErrorIs(t, err, quota.ErrSchemaMissing)
		var sv *quota.SchemaVersionError
		require.ErrorAs(t, err, &sv)
		require.Equal(t, unknown, sv.Have)
		require.Contains(t, err.Error(), "upgrade pgquota")
	}
}

// A database that misses a migration below its newest one is an error for
// Up and CheckSchema naming the version and `migrate up --allow-missing`,
// which applies it (where CheckSchema returned nil).
func TestSchemaGapIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	db := openDB(t, dbURL, 2)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	want := pgtest.SchemaSnapshot(t, pgtest.Connect(t, dbURL, 1), migrations.Schema)
	// Version 4's row is gone (its objects stay): a gap.
	_, err = db.ExecContext(ctx, `DELETE FROM `+migrations.VersionTable+` WHERE version_id = 4`)
	require.NoError(t, err)

	client, err := quota.New(pgtest.Connect(t, dbURL, 1), nil)
	require.NoError(t, err)
	err = client.CheckSchema(ctx)
	require.ErrorIs(t, err, quota.ErrSchemaGap)
	require.Contains(t, err.Error(), "version 4 (00004_ledger.sql) is not applied")
	require.Contains(t, err.Error(), "pgquota migrate up --allow-missing")
	require.Contains(t, err.Error(), "INSERT INTO pgquota.pgquota_migrations (version_id, is_applied) VALUES (4, true)")

	res, err := migrations.Up(ctx, db)
	require.ErrorIs(t, err, migrations.ErrSchemaGap)
	require.Empty(t, res)
	var se *migrations.SchemaError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int64{4}, se.Missing)

	// The way out the message gives for objects that exist: record it.
	_, err = db.ExecContext(ctx, `INSERT INTO pgquota.pgquota_migrations (version_id, is_applied) VALUES (4, true)`)
	require.NoError(t, err)
	require.NoError(t, client.CheckSchema(ctx))
	res, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Empty(t, res)
	require.Equal(t, want, pgtest.SchemaSnapshot(t, pgtest.Connect(t, dbURL, 1), migrations.Schema))
}

// A database migrated by an earlier build has goose's version table under
// goose's default name (pgquota.goose_db_version) and goose's lock table:
// the next Up renames the one, drops the other, applies what is pending,
// and leaves the schema a fresh database gets.
func TestUpRenamesLegacyVersionTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := referenceSchema(t)

	dbURL := pgtest.NewEmptyURL(t)
	db := openDB(t, dbURL, 2)
	// What earlier builds left: the version table under goose's default
	// name with versions 1..5 applied, and goose's lock table.
	_, err := db.ExecContext(ctx, `CREATE SCHEMA pgquota`)
	require.NoError(t, err)
	legacy, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(migrations.LegacyVersionTable), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = legacy.UpTo(ctx, 5)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `CREATE TABLE `+migrations.LegacyLockTable+` (lock_id bigint PRIMARY KEY)`)
	require.NoError(t, err)

	// Read-only questions read the legacy table before the rename.
	st, err := migrations.ReadState(ctx, db)
	require.NoError(t, err)
	require.Equal(t, migrations.LegacyVersionTable, st.Table)
	require.Equal(t, int64(5), st.Current)

	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Equal(t, want, pgtest.SchemaSnapshot(t, pgtest.Connect(t, dbURL, 1), migrations.Schema))
	require.Equal(t, allOnce(), appliedVersions(t, db))
}
