// Package migrations holds pgquota's SQL migrations and runs them with goose.
//
// The migrations create and change the tables of the pgquota schema. They are
// plain goose SQL files embedded in FS, so a host application can apply them
// with its own tooling; NewProvider returns a goose Provider configured the
// way pgquota needs it:
//
//   - goose's version table is pgquota.goose_db_version, so an application
//     that also uses goose (public.goose_db_version) never collides with us;
//   - goose's global registry of Go migrations is disabled;
//   - a table-based Postgres lock (pgquota.goose_lock) makes replicas that
//     migrate at once apply each migration exactly once. It needs no session
//     state, so it also works behind a transaction-mode connection pooler.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the SQL migration files, named 00001_name.sql and so on.
//
//go:embed *.sql
var FS embed.FS

const (
	// Schema is the PostgreSQL schema that holds every pgquota table.
	Schema = "pgquota"
	// VersionTable is goose's version table for pgquota's migrations.
	VersionTable = Schema + ".goose_db_version"
	// LockTable is the table goose's Postgres locker uses while migrating.
	LockTable = Schema + ".goose_lock"
)

// lockRetryInterval is how often a replica that waits for another one's
// migration lock tries again; lockRetries bounds the wait to about 5 minutes.
const (
	lockRetryInterval = 250 * time.Millisecond
	lockRetries       = 1200
)

// NewProvider returns a goose Provider for pgquota's migrations on db, with
// the version table, lock and registry settings described in the package
// documentation. Call EnsureSchema first: goose keeps its tables in the
// pgquota schema. db is typically stdlib.OpenDBFromPool(pool) from
// github.com/jackc/pgx/v5/stdlib.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableName(LockTable),
		lock.WithTableLockTimeout(lockRetryInterval, lockRetries),
	)
	if err != nil {
		return nil, fmt.Errorf("pgquota: migration locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLocker(locker),
	)
	if err != nil {
		return nil, fmt.Errorf("pgquota: migrations: %w", err)
	}
	return p, nil
}

// EnsureSchema creates the pgquota schema when it does not exist yet. Several
// processes may call it at once: CREATE SCHEMA IF NOT EXISTS can still fail
// with a unique violation when two sessions create the schema concurrently, so
// the creation runs under a transaction-level advisory lock (released at
// commit, so no session state is left behind).
func EnsureSchema(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("pgquota: create schema: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('pgquota.schema', 0))`); err != nil {
		return fmt.Errorf("pgquota: create schema: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+Schema); err != nil {
		return fmt.Errorf("pgquota: create schema: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("pgquota: create schema: %w", err)
	}
	return nil
}

// Up creates the schema if needed and applies every pending migration.
func Up(ctx context.Context, db *sql.DB) ([]*goose.MigrationResult, error) {
	if err := EnsureSchema(ctx, db); err != nil {
		return nil, err
	}
	p, err := NewProvider(db)
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("pgquota: migrate up: %w", err)
	}
	return res, nil
}

// Latest returns the version of the newest embedded migration: the version a
// database must be at for this build of pgquota.
func Latest() int64 {
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		panic(err) // the pattern is constant and valid
	}
	var latest int64
	for _, name := range names {
		v, err := goose.NumericComponent(name)
		if err != nil {
			panic(fmt.Sprintf("pgquota: migration %s: %v", name, err)) // caught by the package's tests
		}
		latest = max(latest, v)
	}
	return latest
}

// IsUndefinedSchemaError reports whether err is PostgreSQL's answer to a
// statement that needs a pgquota table, column or function the database
// does not have: 3F000 (invalid_schema_name), 42P01 (undefined_table),
// 42703 (undefined_column) or 42883 (undefined_function).
func IsUndefinedSchemaError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "3F000", "42P01", "42703", "42883":
		return true
	}
	return false
}
