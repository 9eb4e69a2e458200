package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/migrations"
)

// EnvAppRole names the environment variable that, set to 1, makes Connect
// and NewPool connect as AppLogin, a LOGIN role whose only privileges come
// from membership in migrations.AppRole, while databases are still created
// and migrated as the server URL's role (through pgtestdb's owner). It
// proves that the application role can make every call. Tests that run DDL
// on purpose (migrating, attaching a fence guard, pinning pgquota.clock)
// use ConnectOwner for it.
const EnvAppRole = "PGQUOTA_TEST_APP_ROLE"

// AppLogin is the LOGIN role of EnvAppRole mode, a member of
// migrations.AppRole. Roles are cluster-wide: it is created once per server
// and shared by every test database.
const AppLogin = "pgquota_test_app"

// appLoginPassword is AppLogin's password, for servers that do not trust
// local connections.
const appLoginPassword = "pgquota_test_app"

// AppRoleMode reports whether EnvAppRole is set to 1.
func AppRoleMode() bool { return os.Getenv(EnvAppRole) == "1" }

var roles struct {
	once sync.Once
	err  error
}

// ensureRoles creates migrations.AppRole (NOLOGIN) and AppLogin (LOGIN,
// member of it) on the test server as the server URL's role, once per
// process. Other test processes do the same at the same time: creating a
// role that another session creates concurrently fails with 23505 or 42710,
// which means it exists; a concurrent GRANT of the same membership may
// fail with "tuple concurrently updated", so that is tried again.
func ensureRoles(base string) error {
	roles.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			roles.err = fmt.Errorf("pgtest: create roles: %w", err)
			return
		}
		defer conn.Close(ctx)
		stmt := fmt.Sprintf(`
DO $$
BEGIN
    BEGIN
        CREATE ROLE %[1]s NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    BEGIN
        CREATE ROLE %[2]s LOGIN PASSWORD '%[3]s';
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    IF NOT pg_has_role('%[2]s', '%[1]s', 'MEMBER') THEN
        GRANT %[1]s TO %[2]s;
    END IF;
END
$$`, migrations.AppRole, AppLogin, appLoginPassword)
		for attempt := 0; ; attempt++ {
			if _, err = conn.Exec(ctx, stmt); err == nil || attempt == 5 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			roles.err = fmt.Errorf("pgtest: create roles %s and %s as the server URL's role (it needs CREATEROLE): %w", migrations.AppRole, AppLogin, err)
		}
	})
	return roles.err
}

// AppURL returns dbURL with AppLogin as its user, creating the roles when
// needed.
func AppURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	if err := ensureRoles(BaseURL(tb)); err != nil {
		tb.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("pgtest: parse %q: %v", dbURL, err)
	}
	u.User = url.UserPassword(AppLogin, appLoginPassword)
	return u.String()
}

// ConnectOwner opens a pool on dbURL as the database's owner (the role
// that migrated it), whatever EnvAppRole says, closed when the test ends.
// Tests use it for DDL they run on purpose.
func ConnectOwner(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return connect(tb, dbURL, maxConns)
}
