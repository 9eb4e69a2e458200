// Package quotatest gives the tests of an application built on pgquota a
// fresh PostgreSQL database each, with pgquota's schema migrated, so that
// handler and service tests run against the real thing (no mocks) and in
// parallel, each on its own counters, leases and fences:
//
//	func TestSignupIsRateLimited(t *testing.T) {
//		t.Parallel()
//		db := quotatest.NewDatabase(t)
//		client, err := quota.New(db.Pool, nil)
//		...
//	}
//
// The server comes from the environment variable PGQUOTA_TEST_DATABASE_URL
// (EnvURL), or from WithURL: a postgres:// URL of PostgreSQL 13 or later,
// on a direct connection (not through a transaction-mode pooler), as a
// role that may create databases (CREATEDB), e.g.
//
//	export PGQUOTA_TEST_DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
//
// When it is unset, malformed or the server does not answer, NewDatabase
// fails the test with a message saying so: it never skips, so a CI job
// without a database cannot pass by running nothing.
//
// How it works: the first call for a build of pgquota migrates a template
// database, pgquotatest_tpl_<hash of the migration files>, with the
// embedded migrations (migrations.UpPool: goose's Provider, under pgquota's
// migration lock), once per server whatever the number of test processes
// (they queue on an advisory lock); each NewDatabase then copies it
// (CREATE DATABASE ... TEMPLATE), which takes milliseconds, under a
// unique name, and drops the copy when the test ends (t.Cleanup, DROP
// DATABASE ... WITH (FORCE)). The template stays on the server for the
// next run; drop pgquotatest_tpl_* databases at will (ALTER DATABASE ...
// IS_TEMPLATE false first). The migrations create pgquota's roles
// (migrations.AppRole and the others) when the role may create roles, and
// warn otherwise, as in production.
//
// Its dependencies are pgx and pgquota's migrations (goose): no test
// framework, no containers.
package quotatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/testdb"
	"github.com/pgquota/pgquota/migrations"
)

// EnvURL names the environment variable that holds the test server's URL.
const EnvURL = "PGQUOTA_TEST_DATABASE_URL"

// Database is a fresh database with pgquota's schema migrated, dropped
// when the test that made it ends.
type Database struct {
	// Name is the database's name: "pgquotatest_" and 16 random
	// hexadecimal digits.
	Name string
	// URL is the server's URL with the database's name as its path, for
	// code under test that opens its own connections.
	URL string
	// Pool is a pool on the database, closed when the test ends.
	Pool *pgxpool.Pool
}

// Option changes what NewDatabase does.
type Option func(*options)

type options struct {
	url      string
	maxConns int32
}

// WithURL takes the server's URL from u instead of PGQUOTA_TEST_DATABASE_URL.
func WithURL(u string) Option { return func(o *options) { o.url = u } }

// WithMaxConns bounds Database.Pool to n connections. Defaults to pgxpool's
// default (the larger of 4 and the number of CPUs). Keep it small when
// many tests run in parallel: they share the server's max_connections.
func WithMaxConns(n int32) Option { return func(o *options) { o.maxConns = n } }

// timeout bounds each step (connect, copy, migrate the template, drop).
const timeout = 2 * time.Minute

// NewDatabase creates a database with every pgquota migration applied,
// copied from the template (see the package documentation), opens a pool
// on it, and registers tb.Cleanup to close the pool and drop the database.
// It fails the test (tb.Fatalf), never skips it, when the server's URL is
// unset or malformed, the server cannot be reached, or the role may not
// create databases.
func NewDatabase(tb testing.TB, opts ...Option) *Database {
	tb.Helper()
	o := options{url: os.Getenv(EnvURL)}
	for _, opt := range opts {
		opt(&o)
	}
	if o.url == "" {
		tb.Fatalf("quotatest: no PostgreSQL to test against: %s is not set. Set it to the URL of a server and a role that may create databases, e.g.\n"+
			"  export %s='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'", EnvURL, EnvURL)
	}
	base, err := url.Parse(o.url)
	if err != nil || (base.Scheme != "postgres" && base.Scheme != "postgresql") || base.Host == "" {
		tb.Fatalf("quotatest: %s must be a postgres:// URL with a host, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable (got %q)", EnvURL, redact(o.url))
	}
	if o.maxConns < 0 {
		tb.Fatalf("quotatest: WithMaxConns(%d): must be at least 1", o.maxConns)
	}

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	admin, err := pgx.Connect(ctx, base.String())
	if err != nil {
		tb.Fatalf("quotatest: cannot connect to the test server %s (%s): %v", base.Redacted(), EnvURL, err)
	}
	defer func() { _ = admin.Close(context.WithoutCancel(ctx)) }()

	tpl, err := ensureTemplate(ctx, admin, base)
	if err != nil {
		tb.Fatalf("quotatest: %v", err)
	}
	name := "pgquotatest_" + randomHex(8)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tpl}.Sanitize()); err != nil {
		tb.Fatalf("quotatest: create database %s from template %s: %v", name, tpl, err)
	}
	tb.Cleanup(func() {
		if err := dropDatabase(base, name); err != nil {
			tb.Errorf("quotatest: %v", err)
		}
	})

	dbURL := withDatabase(base, name)
	cfg, err := pgxpool.ParseConfig(dbURL.String())
	if err != nil {
		tb.Fatalf("quotatest: %v", err)
	}
	if o.maxConns > 0 {
		cfg.MaxConns = o.maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("quotatest: open a pool on %s: %v", dbURL.Redacted(), err)
	}
	tb.Cleanup(pool.Close) // runs before the drop (cleanups run last first)
	return &Database{Name: name, URL: dbURL.String(), Pool: pool}
}

// NewPool is NewDatabase(tb, opts...).Pool.
func NewPool(tb testing.TB, opts ...Option) *pgxpool.Pool {
	tb.Helper()
	return NewDatabase(tb, opts...).Pool
}

// templateLockKey is the advisory lock under which one process at a time
// builds a template.
const templateLockKey = `hashtextextended('pgquota.quotatest.template', 0)`

// ensureTemplate returns the name of the migrated template of this build's
// migrations, building it first when the server has none: under the
// advisory lock, migrated under a temporary name and renamed when
// complete, so that a build interrupted halfway is never copied.
func ensureTemplate(ctx context.Context, admin *pgx.Conn, base *url.URL) (string, error) {
	hash, err := testdb.MigrationsHash()
	if err != nil {
		return "", err
	}
	tpl := "pgquotatest_tpl_" + hash
	ready := func() (bool, error) {
		var ok bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1 AND datistemplate)`, tpl).Scan(&ok)
		return ok, err
	}
	if ok, err := ready(); err != nil || ok {
		return tpl, err
	}
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(`+templateLockKey+`)`); err != nil {
		return "", fmt.Errorf("take the template lock: %w", err)
	}
	defer func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+templateLockKey+`)`)
	}()
	if ok, err := ready(); err != nil || ok {
		return tpl, err // built by another process meanwhile
	}
	building := tpl + "_build"
	for _, stmt := range []string{
		"DROP DATABASE IF EXISTS " + pgx.Identifier{building}.Sanitize() + " WITH (FORCE)", // left by a process that died building it
		// A database of the template's name not marked as a template: a
		// process died between the rename and the mark, or someone unmarked
		// it to drop it. It was never a complete template; build it anew.
		"DROP DATABASE IF EXISTS " + pgx.Identifier{tpl}.Sanitize() + " WITH (FORCE)",
		"CREATE DATABASE " + pgx.Identifier{building}.Sanitize(),
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return "", fmt.Errorf("build template %s (the role needs CREATEDB): %s: %w", tpl, stmt, err)
		}
	}
	if err := migrate(ctx, withDatabase(base, building)); err != nil {
		return "", fmt.Errorf("migrate template %s: %w", building, err)
	}
	for _, stmt := range []string{
		"ALTER DATABASE " + pgx.Identifier{building}.Sanitize() + " RENAME TO " + pgx.Identifier{tpl}.Sanitize(),
		"ALTER DATABASE " + pgx.Identifier{tpl}.Sanitize() + " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return "", fmt.Errorf("build template %s: %s: %w", tpl, stmt, err)
		}
	}
	return tpl, nil
}

// migrate applies every pgquota migration to the database at u, through
// goose's Provider (migrations.UpPool), on one connection that it closes.
func migrate(ctx context.Context, u *url.URL) error {
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return err
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = migrations.UpPool(ctx, pool)
	return err
}

// dropDatabase drops name on the server at base, ending its sessions.
func dropDatabase(base *url.URL, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base.String())
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// withDatabase returns base with its path set to the database name.
func withDatabase(base *url.URL, name string) *url.URL {
	u := *base
	u.Path, u.RawPath = "/"+name, ""
	return &u
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// redact hides a URL's password, when it parses.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(not a URL)"
}
