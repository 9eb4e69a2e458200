package pgtest

import (
	"context"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/internal/pgbouncer"
)

// EnvPooler names the environment variable that routes the tests' client
// pools through a transaction pooler. Its one value, "pgbouncer", starts
// one real PgBouncer in transaction mode (internal/pgbouncer) per test
// binary, in front of the test server; NewPool then hands out pools through
// it, in pgx's exec mode. It keeps PoolerServerConns server connections
// per database, fewer than the tests' client pools hold (up to 32), so
// clients share them transaction by transaction.
// Admin work (creating and dropping databases, Connect) stays direct.
// Tests make their Clients with quota.Config.Pooler = PoolerTransaction
// when Pooled says so.
const EnvPooler = "PGQUOTA_TEST_POOLER"

// Pooled reports whether client pools go through a transaction pooler
// (EnvPooler is "pgbouncer"). Any other non-empty value fails the test.
func Pooled(tb testing.TB) bool {
	tb.Helper()
	switch v := os.Getenv(EnvPooler); v {
	case "":
		return false
	case "pgbouncer":
		return true
	default:
		tb.Fatalf("pgtest: %s=%q: the only pooler is pgbouncer (or leave it unset)", EnvPooler, v)
		return false
	}
}

// NeedsSession excludes a test from the pooled run when it needs a
// session's features on purpose (LISTEN, a session that outlives a
// transaction), saying why: such a test cannot pass behind a transaction
// pooler, and what it proves is covered by the direct run.
func NeedsSession(tb testing.TB, reason string) {
	tb.Helper()
	if Pooled(tb) {
		tb.Skipf("excluded under %s=pgbouncer: needs a server session of its own (%s); the run without the pooler covers it", EnvPooler, reason)
	}
}

// PoolerServerConns is the per-binary PgBouncer's default_pool_size. Some
// tests hold up to 6 transactions open on purpose (code holders, late
// outbox producers) while other calls must go on; with fewer server
// connections than that they would wait for one forever.
const PoolerServerConns = 10

// poolerWait is the per-binary PgBouncer's query_wait_timeout: a test that
// waits this long for a server connection fails with SQLSTATE 08P01.
const poolerWait = 60 * time.Second

var bouncer struct {
	once sync.Once
	b    *pgbouncer.Bouncer
	err  error
}

// PoolURL returns dbURL (a database on the test server) as client pools
// reach it: through the test binary's PgBouncer, in pgx's exec mode, when
// Pooled, else dbURL itself.
func PoolURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	if !Pooled(tb) {
		return dbURL
	}
	base := BaseURL(tb)
	bouncer.once.Do(func() {
		// Stopped when the test binary exits (internal/pgbouncer).
		bouncer.b, bouncer.err = pgbouncer.StartProcess(base, pgbouncer.Options{PoolSize: PoolerServerConns, QueryWaitTimeout: poolerWait})
	})
	if bouncer.err != nil {
		tb.Fatalf("pgtest: %s=pgbouncer: %v", EnvPooler, bouncer.err)
	}
	pooled, err := bouncer.b.URL(dbURL)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	// PgBouncer keeps its server connections to the test's database open
	// after the test's pools close, and the database cannot be dropped
	// while they are (55006). Cleanups run last-in first-out, so this one
	// ends them before pgtestdb drops the database.
	if d, err := url.Parse(dbURL); err == nil {
		name := strings.TrimPrefix(d.Path, "/")
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, base)
			if err != nil {
				return
			}
			defer conn.Close(ctx)
			_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
		})
	}
	u, err := url.Parse(pooled)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	return u.String()
}
