// Package pgtest gives tests a fresh, migrated PostgreSQL database each.
//
// The server comes from PGQUOTA_TEST_DATABASE_URL (a libpq URL of a role that
// may create roles and databases, e.g.
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). Without it,
// a PostgreSQL container is started with testcontainers-go when a Docker
// engine answers. Without either, the test fails with a message saying how
// to provide one: it never skips.
//
// Connections count against the suite's budget (Budget, Reserve):
// PGQUOTA_TEST_MAX_CONNS (default 60) over PGQUOTA_TEST_BINARIES test
// binaries run at once (default 2, make test's -p), so that the suite
// never holds more than that on the server whatever its parallelism.
//
// Databases are cloned from a template migrated once per set of migrations
// (github.com/peterldowns/pgtestdb), so tests can run in parallel, each on
// its own schema. A failed test's database is kept for inspection; its URL
// is in the test log.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver pgtestdb uses
	"github.com/peterldowns/pgtestdb"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgquota/pgquota/internal/testdb"
	"github.com/pgquota/pgquota/migrations"
)

// EnvURL names the environment variable that holds the test server's URL.
const EnvURL = "PGQUOTA_TEST_DATABASE_URL"

// BaseURL returns the URL of the test server's maintenance database.
func BaseURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	u, err := containerURL()
	if err != nil {
		tb.Fatalf("pgtest: no PostgreSQL to test against. Set %s to a server's URL, e.g.\n"+
			"  export %s='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'\n"+
			"or start a Docker engine so that testcontainers-go can run one (%v)", EnvURL, EnvURL, err)
	}
	return u
}

var container struct {
	once sync.Once
	url  string
	err  error
}

// containerURL starts one PostgreSQL container for the whole test binary,
// when a Docker engine answers. testcontainers' reaper removes it when the
// binary exits.
func containerURL() (string, error) {
	container.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		container.url, container.err = startContainer(ctx)
	})
	return container.url, container.err
}

func startContainer(ctx context.Context) (_ string, err error) {
	defer func() {
		// testcontainers panics in some setups without a Docker socket.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	ctr, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", fmt.Errorf("start postgres container: %w", err)
	}
	return ctr.ConnectionString(ctx, "sslmode=disable")
}

// config turns the server URL into pgtestdb's configuration.
func config(tb testing.TB) pgtestdb.Config {
	tb.Helper()
	raw := BaseURL(tb)
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		tb.Fatalf("pgtest: %s must be a postgres:// URL with a host, got %q", EnvURL, raw)
	}
	pass, _ := u.User.Password()
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	q := u.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
	}
	return pgtestdb.Config{
		DriverName:                "pgx",
		Host:                      u.Hostname(),
		Port:                      port,
		User:                      u.User.Username(),
		Password:                  pass,
		Database:                  strings.TrimPrefix(u.Path, "/"),
		Options:                   q.Encode(),
		ForceTerminateConnections: true,
	}
}

// migrator builds pgtestdb's template with pgquota's own migration path
// (migrations.Up), and names it by a hash of the migration files.
type migrator struct{}

func (migrator) Hash() (string, error) { return testdb.MigrationsHash() }

func (migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	_, err := migrations.Up(ctx, db)
	return err
}

// NewURL creates a fresh database with every pgquota migration applied and
// returns its URL. The database is dropped when the test passes.
func NewURL(tb testing.TB) string {
	tb.Helper()
	// The template's migrations grant pgquota's objects to
	// migrations.AppRole, which pgtestdb's owner may not create.
	if err := ensureRoles(BaseURL(tb)); err != nil {
		tb.Fatal(err)
	}
	reserveDatabases(tb)
	return pgtestdb.Custom(tb, config(tb), migrator{}).URL()
}

// NewEmptyURL creates a fresh, empty database (no pgquota schema) and
// returns its URL.
func NewEmptyURL(tb testing.TB) string {
	tb.Helper()
	if err := ensureRoles(BaseURL(tb)); err != nil {
		tb.Fatal(err)
	}
	reserveDatabases(tb)
	return pgtestdb.Custom(tb, config(tb), pgtestdb.NoopMigrator{}).URL()
}

// NewPool returns a pool on a fresh migrated database, closed when the test
// ends. maxConns bounds the pool (0 means 8); tests that run hundreds of
// goroutines keep it small, since the server's max_connections is shared by
// every test running in parallel. Under PGQUOTA_TEST_POOLER=pgbouncer the
// pool goes through a transaction pooler (PoolURL).
func NewPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return Connect(tb, PoolURL(tb, NewURL(tb)), maxConns)
}

// Connect opens a pool on dbURL, closed when the test ends. It connects
// where dbURL says, also under PGQUOTA_TEST_POOLER (see PoolURL); with
// EnvAppRole=1 it connects as AppLogin instead (see SuiteURL,
// ConnectOperator, ConnectRelay, ConnectOwner).
func Connect(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	dbURL = SuiteURL(tb, dbURL)
	return connect(tb, dbURL, maxConns)
}

func connect(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatalf("pgtest: parse %q: %v", dbURL, err)
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = maxConns
	Reserve(tb, int(maxConns), fmt.Sprintf("a pool of %d", maxConns))
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
