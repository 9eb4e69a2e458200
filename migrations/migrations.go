// Package migrations holds pgquota's SQL migrations and runs them with goose.
//
// The migrations create and change the tables of the pgquota schema. They are
// plain goose SQL files embedded in FS, so a host application can apply them
// with its own tooling; Up applies them on a *sql.DB and UpPool on the
// *pgxpool.Pool that quota.New takes; NewProvider returns a goose Provider
// configured the way pgquota needs it:
//
//   - goose's version table is pgquota.pgquota_migrations (VersionTable). No
//     migration tool uses that name by default, so an application that runs
//     its own goose (goose_db_version), even with pgquota on its search_path,
//     never finds pgquota's history under its own names. Databases migrated
//     before it was renamed have pgquota.goose_db_version: the first
//     migration run renames it (and drops goose's old lock table
//     pgquota.goose_lock).
//   - goose's global registry of Go migrations is disabled;
//   - replicas that migrate at once queue on a session-level advisory lock
//     (pg_advisory_lock, the PostgreSQL manual, "Advisory Locks") taken on
//     the one connection goose migrates on, before anything is created:
//     the schema, the version table and each migration are created by one
//     session at a time, and a pool of one connection is enough. The lock
//     is released when the run ends (or with the session, if the process
//     dies). Migrate on a direct connection or through a session-mode
//     pooler: a transaction-mode pooler (PgBouncer pool_mode=transaction)
//     cannot keep a session lock, and the run fails when its lock turns out
//     to be gone at the end.
//
// Read-only questions (ReadState: the applied versions, newer or missing
// ones) take no lock and create nothing.
package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"github.com/pgquota/pgquota/internal/errtext"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// FS holds the SQL migration files, named 00001_name.sql and so on.
//
//go:embed *.sql
var FS embed.FS

const (
	// Schema is the PostgreSQL schema that holds every pgquota table.
	Schema = "pgquota"
	// VersionTable is goose's version table for pgquota's migrations.
	VersionTable = Schema + ".pgquota_migrations"
	// LegacyVersionTable is the version table's name before it was
	// renamed to VersionTable (a name goose uses by default, so an
	// application's goose with pgquota on its search_path took it for its
	// own). A migration run renames it.
	LegacyVersionTable = Schema + ".goose_db_version"
	// LegacyLockTable is goose's table locker's table, used by builds
	// before the advisory lock; a migration run drops it.
	LegacyLockTable = Schema + ".goose_lock"
	// AppRole is the NOLOGIN group role that holds the privileges an
	// application needs to make every pgquota call (and no DDL): grant it
	// to the role the application logs in as. Migration 00010 creates it
	// when it is missing and grants it on every pgquota object, now and
	// (by default privileges) in later migrations. See GrantAppSQL.
	AppRole = "pgquota_app"
	// RelayRole is the NOLOGIN group role of the outbox relay: claim, mark
	// delivered or failed, reap (migration 00022).
	RelayRole = "pgquota_relay"
	// OperatorRole is the NOLOGIN group role that defines quotas and
	// campaigns, sets limits, imports codes, bumps lease epochs, registers
	// fence guards and reaps; a member of AppRole and RelayRole (migration
	// 00022).
	OperatorRole = "pgquota_operator"
)

// lockKey is the key of the migration lock: pg_advisory_lock(lockKey).
// Advisory locks are per database, so migrations of separate databases on
// one server never wait for each other.
const lockKey = `hashtextextended('pgquota.migrate', 0)`

// Option changes how Up migrates.
type Option func(*options)

type options struct{ allowMissing bool }

// AllowMissing makes Up apply migrations that are missing below the
// database's newest applied version (a gap: see ErrSchemaGap), out of
// order, instead of failing.
func AllowMissing() Option { return func(o *options) { o.allowMissing = true } }

// NewProvider returns a goose Provider for pgquota's migrations on db, with
// the version table, lock and registry settings described in the package
// documentation. Each of its runs (Up, Down, Status, GetDBVersion, ...)
// takes the migration lock, creates the schema when it is missing and
// renames a legacy version table first, so EnsureSchema is not needed.
// db is typically stdlib.OpenDBFromPool(pool) from
// github.com/jackc/pgx/v5/stdlib; a pool of one connection is enough.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	return newProvider(db, &locker{})
}

func newProvider(db *sql.DB, l *locker) (*goose.Provider, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(l),
		goose.WithAllowOutofOrder(l.opts.allowMissing),
	)
	if err != nil {
		return nil, errorf("pgquota: migrations: %w", err)
	}
	return p, nil
}

// locker is goose's SessionLocker for pgquota: the advisory lock, then,
// still on the locked connection and before goose looks for its version
// table, the schema and the legacy rename (prepare). With check set it
// also refuses a schema newer than this build or with a gap, keeping the
// error in checkErr.
type locker struct {
	opts     options
	check    bool
	checkErr error
}

func (l *locker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(`+lockKey+`)`); err != nil {
		// The lock may have been granted just as the wait was cancelled:
		// end the session, which releases it, rather than pool it.
		discard(conn)
		return errorf("pgquota: take the migration lock: %w", err)
	}
	if err := l.prepare(ctx, conn); err != nil {
		if uerr := l.SessionUnlock(context.WithoutCancel(ctx), conn); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return err
	}
	return nil
}

func (l *locker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released bool
	err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock(`+lockKey+`)`).Scan(&released)
	if err != nil || !released {
		discard(conn)
	}
	if err != nil {
		return errorf("pgquota: release the migration lock (the session was ended, which releases it): %w", err)
	}
	if !released {
		return errors.New("pgquota: the migration lock was not held by this session at the end of the run: " +
			"is a transaction-mode pooler between pgquota and the database? Migrate on a direct connection " +
			"(or a session-mode pool); other migration runs may have run at the same time")
	}
	return nil
}

// discard makes database/sql close conn's session instead of pooling it.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// prepare runs prepareTx in a transaction on conn, which holds the
// migration lock.
func (l *locker) prepare(ctx context.Context, conn *sql.Conn) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return errorf("pgquota: prepare migration: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := l.prepareTx(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return errorf("pgquota: prepare migration: %w", err)
	}
	return nil
}

// prepareTx runs under the migration lock: it creates the schema when it
// is missing (CREATE SCHEMA needs the CREATE privilege on the database even
// with IF NOT EXISTS, so an existing schema is left alone), renames a
// legacy version table, drops goose's old lock table, creates the version
// table as goose would (goose's Provider.Up looks for it, and creates it,
// before it takes any lock: two replicas did so at once), and checks the
// applied versions when asked.
func (l *locker) prepareTx(ctx context.Context, tx *sql.Tx) error {
	var hasSchema, hasTable, hasLegacy, hasLegacyLock bool
	if err := tx.QueryRowContext(ctx, `
		SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL,
		       to_regclass($3) IS NOT NULL, to_regclass($4) IS NOT NULL`,
		Schema, VersionTable, LegacyVersionTable, LegacyLockTable).Scan(&hasSchema, &hasTable, &hasLegacy, &hasLegacyLock); err != nil {
		return errorf("pgquota: prepare migration: %w", err)
	}
	var stmts []string
	if !hasSchema {
		stmts = append(stmts, `CREATE SCHEMA `+Schema)
	}
	if !hasTable && hasLegacy {
		// The names a fresh goose gives the table's identity sequence and
		// primary key, so a renamed database matches a new one.
		stmts = append(stmts,
			`ALTER TABLE `+LegacyVersionTable+` RENAME TO pgquota_migrations`,
			`ALTER SEQUENCE IF EXISTS `+Schema+`.goose_db_version_id_seq RENAME TO pgquota_migrations_id_seq`,
			`ALTER INDEX IF EXISTS `+Schema+`.goose_db_version_pkey RENAME TO pgquota_migrations_pkey`)
	}
	if hasLegacyLock {
		stmts = append(stmts, `DROP TABLE `+LegacyLockTable)
	}
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return errorf("pgquota: prepare migration: %s: %w", stmt, err)
		}
	}
	if !hasTable && !hasLegacy {
		store, err := database.NewStore(goose.DialectPostgres, VersionTable)
		if err != nil {
			return errorf("pgquota: prepare migration: %w", err)
		}
		if err := store.CreateVersionTable(ctx, tx); err != nil {
			return errorf("pgquota: create version table %s: %w", VersionTable, err)
		}
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
			return errorf("pgquota: create version table %s: %w", VersionTable, err)
		}
	}
	if l.check {
		st, err := ReadState(ctx, tx)
		if err != nil {
			return err
		}
		if err := st.Check(l.opts.allowMissing); err != nil {
			l.checkErr = err
			return err
		}
	}
	return nil
}

// prepareLocked runs prepareTx in a transaction of its own on db that takes
// the migration lock at transaction level (the same key as the session
// lock, so the two exclude each other), released at commit.
func (l *locker) prepareLocked(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return errorf("pgquota: prepare migration: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(`+lockKey+`)`); err != nil {
		return errorf("pgquota: take the migration lock: %w", err)
	}
	if err := l.prepareTx(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return errorf("pgquota: prepare migration: %w", err)
	}
	return nil
}

// EnsureSchema prepares db for goose under the migration lock, taken at
// transaction level: it creates the pgquota schema and the version table
// when they do not exist yet, and renames a legacy version table. Up does
// it itself; call it before a NewProvider's Up or UpTo, which look for the
// version table, and create it, before taking any lock. Several processes
// may call it at once; it leaves no session state behind.
func EnsureSchema(ctx context.Context, db *sql.DB) error {
	return (&locker{}).prepareLocked(ctx, db)
}

// Up applies every pending migration, under the migration lock, creating
// the schema and the version table when they are missing. It returns what
// it applied. It fails without applying anything, with a *SchemaError,
// when the database has migrations this build does not know (ErrSchemaNewer)
// or misses one below its newest (ErrSchemaGap, unless AllowMissing).
//
// When the database has the citus extension, Up then distributes the
// tables that Citus does not know yet (see distributeCitus in citus.go),
// in a transaction of its own: it fails with an *UnplannedTableError,
// with the migrations applied, when a table is not in the plan.
func Up(ctx context.Context, db *sql.DB, opts ...Option) ([]*goose.MigrationResult, error) {
	l := &locker{check: true}
	for _, o := range opts {
		o(&l.opts)
	}
	if err := CheckNotCitusWorker(ctx, db); err != nil {
		return nil, err
	}
	// goose's Up looks for its version table before it locks: create it
	// (and check the state) under the lock first.
	if err := l.prepareLocked(ctx, db); err != nil {
		return nil, err
	}
	p, err := newProvider(db, l)
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if l.checkErr != nil {
		return nil, l.checkErr
	}
	if err != nil {
		return res, errorf("pgquota: migrate up: %w", err)
	}
	if err := distributeCitus(ctx, db); err != nil {
		return res, err
	}
	return res, nil
}

// Sentinel errors of the schema's state, wrapped by *SchemaError (and by
// quota.SchemaVersionError, as quota.ErrSchemaNewer and quota.ErrSchemaGap).
var (
	// ErrSchemaNewer: the database has migrations applied that this build
	// does not have (a newer build of pgquota migrated it).
	ErrSchemaNewer = errors.New("pgquota: schema is newer than this build of pgquota")
	// ErrSchemaGap: a migration of this build is not applied although a
	// higher version is (applied out of order, or its version row was
	// removed).
	ErrSchemaGap = errors.New("pgquota: schema misses a migration below its newest one")
)

// SchemaError describes a schema this build cannot migrate as it is. It
// wraps ErrSchemaNewer when Unknown is not empty and ErrSchemaGap when
// Missing is not empty; its message says what to do.
type SchemaError struct {
	// Current is the database's newest applied version.
	Current int64
	// Latest is the newest migration of this build.
	Latest int64
	// Unknown lists applied versions this build has no migration for.
	Unknown []int64
	// Missing lists this build's versions below Current that are not
	// applied.
	Missing []int64
}

func (e *SchemaError) Error() string {
	var parts []string
	if len(e.Unknown) > 0 {
		parts = append(parts, fmt.Sprintf("schema is at version %d, newer than this build of pgquota (its newest migration is %d; "+
			"applied migrations this build does not know: %s): upgrade pgquota to the build that migrated it "+
			"(or roll back with that build: pgquota migrate down --to %d)",
			e.Current, e.Latest, joinVersions(e.Unknown), e.Latest))
	}
	if len(e.Missing) > 0 {
		names := make([]string, len(e.Missing))
		for i, v := range e.Missing {
			names[i] = fmt.Sprintf("version %d (%s)", v, fileOf(v))
		}
		verb, it := "is", "it"
		if len(e.Missing) > 1 {
			verb, it = "are", "them"
		}
		parts = append(parts, fmt.Sprintf("schema is at version %d but %s %s not applied (applied out of order, or removed from %s): "+
			"run pgquota migrate up --allow-missing to apply %s, or, where a migration's objects exist already, record it: "+
			"INSERT INTO %s (version_id, is_applied) VALUES (%d, true)",
			e.Current, strings.Join(names, ", "), verb, VersionTable, it, VersionTable, e.Missing[0]))
	}
	return "pgquota: " + strings.Join(parts, "; and ")
}

// Unwrap returns ErrSchemaNewer and/or ErrSchemaGap.
func (e *SchemaError) Unwrap() []error {
	var out []error
	if len(e.Unknown) > 0 {
		out = append(out, ErrSchemaNewer)
	}
	if len(e.Missing) > 0 {
		out = append(out, ErrSchemaGap)
	}
	return out
}

func joinVersions(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ", ")
}

// fileOf names the migration file of version v, or "" when there is none.
func fileOf(v int64) string {
	for _, s := range sources() {
		if s.version == v {
			return s.name
		}
	}
	return ""
}

// DBTX is what ReadState reads through: *sql.DB, *sql.Conn or *sql.Tx.
type DBTX interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// State is a database's migration state, as ReadState reads it.
type State struct {
	// Installed reports whether pgquota's version table exists.
	Installed bool
	// Table is the version table read (VersionTable, or
	// LegacyVersionTable before the first run of this build), "" when
	// none exists.
	Table string
	// Applied holds every applied version (above goose's version 0) with
	// the time goose recorded, in the database server's time zone.
	Applied map[int64]time.Time
	// Current is the newest applied version, 0 for none.
	Current int64
}

// ReadState reads the applied migrations without taking the migration
// lock and without creating anything, so it answers while another process
// migrates, and with SELECT on the version table only (AppRole has it).
// A missing schema or version table is version 0, except on a Citus
// worker node: *CitusWorkerError (ErrCitusWorker).
func ReadState(ctx context.Context, db DBTX) (State, error) {
	st := State{Applied: map[int64]time.Time{}}
	rows, err := db.QueryContext(ctx, `SELECT coalesce(to_regclass($1), to_regclass($2))::text`, VersionTable, LegacyVersionTable)
	if err != nil {
		return st, errorf("pgquota: read schema version: %w", err)
	}
	var table sql.NullString
	for rows.Next() {
		if err := rows.Scan(&table); err != nil {
			rows.Close()
			return st, errorf("pgquota: read schema version: %w", err)
		}
	}
	if err := rows.Close(); err != nil {
		return st, errorf("pgquota: read schema version: %w", err)
	}
	if !table.Valid {
		return st, CheckNotCitusWorker(ctx, db)
	}
	// to_regclass gives the name as search_path would show it: use ours.
	st.Installed, st.Table = true, VersionTable
	if !strings.HasSuffix(table.String, "pgquota_migrations") {
		st.Table = LegacyVersionTable
	}
	// goose inserts a row per applied version and deletes it when rolling
	// back; the newest row of a version decides.
	rows, err = db.QueryContext(ctx, `
		SELECT DISTINCT ON (version_id) version_id, is_applied, tstamp
		FROM `+st.Table+` WHERE version_id > 0
		ORDER BY version_id, id DESC`)
	if err != nil {
		return st, errorf("pgquota: read schema version: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		var applied bool
		var at time.Time
		if err := rows.Scan(&v, &applied, &at); err != nil {
			return st, errorf("pgquota: read schema version: %w", err)
		}
		if applied {
			st.Applied[v] = at
			st.Current = max(st.Current, v)
		}
	}
	if err := rows.Err(); err != nil {
		return st, errorf("pgquota: read schema version: %w", err)
	}
	if st.Current == 0 {
		// The versions are recorded on a Citus coordinator only: a
		// worker's database has pgquota's schema and an empty version
		// table, and is refused rather than read as "not migrated".
		return st, CheckNotCitusWorker(ctx, db)
	}
	return st, nil
}

// Unknown returns the applied versions this build has no migration for,
// in order.
func (s State) Unknown() []int64 {
	known := map[int64]bool{}
	for _, src := range sources() {
		known[src.version] = true
	}
	var out []int64
	for v := range s.Applied {
		if !known[v] {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// Missing returns this build's versions below Current that are not
// applied, in order.
func (s State) Missing() []int64 {
	var out []int64
	for _, src := range sources() {
		if _, ok := s.Applied[src.version]; !ok && src.version < s.Current {
			out = append(out, src.version)
		}
	}
	return out
}

// Pending returns this build's versions that are not applied, in order.
func (s State) Pending() []int64 {
	var out []int64
	for _, src := range sources() {
		if _, ok := s.Applied[src.version]; !ok {
			out = append(out, src.version)
		}
	}
	return out
}

// Check returns a *SchemaError when the database has migrations this build
// does not know, or (unless allowMissing) misses one below its newest.
func (s State) Check(allowMissing bool) error {
	e := &SchemaError{Current: s.Current, Latest: Latest(), Unknown: s.Unknown()}
	if !allowMissing {
		e.Missing = s.Missing()
	}
	if len(e.Unknown)+len(e.Missing) == 0 {
		return nil
	}
	return e
}

type source struct {
	version int64
	name    string
}

// sources lists the embedded migrations in version order.
func sources() []source {
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		panic(err) // the pattern is constant and valid
	}
	out := make([]source, 0, len(names))
	for _, name := range names {
		v, err := goose.NumericComponent(name)
		if err != nil {
			panic(fmt.Sprintf("pgquota: migration %s: %v", name, err)) // caught by the package's tests
		}
		out = append(out, source{v, name})
	}
	slices.SortFunc(out, func(a, b source) int { return int(a.version - b.version) })
	return out
}

// Latest returns the version of the newest embedded migration: the version a
// database must be at for this build of pgquota.
func Latest() int64 {
	src := sources()
	if len(src) == 0 {
		return 0
	}
	return src[len(src)-1].version
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

// errorf is fmt.Errorf whose message carries one "pgquota: " prefix however
// many of the wrapped errors start with one (errtext.Errorf).
var errorf = errtext.Errorf
