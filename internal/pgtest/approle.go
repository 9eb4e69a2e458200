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
// from membership in migrations.AppRole: no DML on any pgquota table, no
// internal function, only the SECURITY DEFINER functions of the
// application's allowlist (the 'pgquota_app' rows of
// pgquota.function_grant) and SELECT on every pgquota table except
// pgquota.fence_secret. Operator work (defining quotas and campaigns,
// member limits, importing codes, bumping the lease epoch, guarding a
// table, reaping leases and the ledger) goes through ConnectOperator, which
// then connects as OperatorLogin (a member of migrations.OperatorRole), and
// the relay's work (claiming, marking and reaping outbox events) through
// ConnectRelay, which then connects as RelayLogin (a member of
// migrations.RelayRole only). Databases are still created and migrated as
// the server URL's role (through pgtestdb's owner). It proves that every
// call works through the functions its role may execute alone. Tests that
// run DDL or DML on purpose (migrating, attaching a fence guard, pinning
// pgquota.clock, rewinding a lease) use ConnectOwner for it. Unset, every
// one of these connects as the server URL's role.
const EnvAppRole = "PGQUOTA_TEST_APP_ROLE"

// AppLogin is a LOGIN role that is a member of migrations.AppRole only.
// Roles are cluster-wide: it is created once per server and shared by
// every test database.
const AppLogin = "pgquota_test_app"

// RelayLogin is a LOGIN role that is a member of migrations.RelayRole only.
const RelayLogin = "pgquota_test_relay"

// OperatorLogin is a LOGIN role that is a member of
// migrations.OperatorRole (itself a member of migrations.AppRole and
// migrations.RelayRole): ConnectOperator's role in EnvAppRole mode.
const OperatorLogin = "pgquota_test_operator"

// appLoginPassword is the test logins' password, for servers that do not trust
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
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['%[1]s', '%[2]s', '%[3]s'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %%I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END LOOP;
    FOREACH r IN ARRAY ARRAY['%[4]s', '%[5]s', '%[6]s'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %%I LOGIN PASSWORD %%L', r, '%[7]s');
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END LOOP;
    IF NOT pg_has_role('%[3]s', '%[1]s', 'MEMBER') THEN GRANT %[1]s TO %[3]s; END IF;
    IF NOT pg_has_role('%[3]s', '%[2]s', 'MEMBER') THEN GRANT %[2]s TO %[3]s; END IF;
    IF NOT pg_has_role('%[4]s', '%[1]s', 'MEMBER') THEN GRANT %[1]s TO %[4]s; END IF;
    IF NOT pg_has_role('%[5]s', '%[2]s', 'MEMBER') THEN GRANT %[2]s TO %[5]s; END IF;
    IF NOT pg_has_role('%[6]s', '%[3]s', 'MEMBER') THEN GRANT %[3]s TO %[6]s; END IF;
END
$$`, migrations.AppRole, migrations.RelayRole, migrations.OperatorRole, AppLogin, RelayLogin, OperatorLogin, appLoginPassword)
		for attempt := 0; ; attempt++ {
			if _, err = conn.Exec(ctx, stmt); err == nil || attempt == 5 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			roles.err = fmt.Errorf("pgtest: create roles %s, %s, %s and their test logins as the server URL's role (it needs CREATEROLE): %w", migrations.AppRole, migrations.RelayRole, migrations.OperatorRole, err)
		}
	})
	return roles.err
}

// AppURL returns dbURL with AppLogin (a member of migrations.AppRole
// only) as its user, creating the roles when needed.
func AppURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	return loginURL(tb, dbURL, AppLogin)
}

// RelayURL returns dbURL with RelayLogin (a member of migrations.RelayRole
// only) as its user.
func RelayURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	return loginURL(tb, dbURL, RelayLogin)
}

// OperatorURL returns dbURL with OperatorLogin (a member of
// migrations.OperatorRole) as its user.
func OperatorURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	return loginURL(tb, dbURL, OperatorLogin)
}

// SuiteURL returns the URL Connect connects to for dbURL: AppURL in
// EnvAppRole mode, dbURL otherwise, or when dbURL already names one of the
// test logins.
func SuiteURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	if !AppRoleMode() {
		return dbURL
	}
	if u, err := url.Parse(dbURL); err == nil && u.User != nil {
		switch u.User.Username() {
		case AppLogin, RelayLogin, OperatorLogin:
			return dbURL
		}
	}
	return AppURL(tb, dbURL)
}

// ConnectOperator opens a pool on dbURL for operator work, closed when the
// test ends: as OperatorLogin in EnvAppRole mode (whatever role dbURL
// names), as dbURL's role otherwise. maxConns bounds it as for Connect.
func ConnectOperator(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	if AppRoleMode() {
		dbURL = OperatorURL(tb, dbURL)
	}
	return connect(tb, dbURL, maxConns)
}

// ConnectRelay opens a pool on dbURL for the outbox relay's work, closed
// when the test ends: as RelayLogin in EnvAppRole mode (whatever role
// dbURL names), as dbURL's role otherwise. maxConns bounds it as for
// Connect.
func ConnectRelay(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	if AppRoleMode() {
		dbURL = RelayURL(tb, dbURL)
	}
	return connect(tb, dbURL, maxConns)
}

func loginURL(tb testing.TB, dbURL, login string) string {
	tb.Helper()
	if err := ensureRoles(BaseURL(tb)); err != nil {
		tb.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("pgtest: parse %q: %v", dbURL, err)
	}
	u.User = url.UserPassword(login, appLoginPassword)
	return u.String()
}

// ConnectOwner opens a pool on dbURL as the database's owner (the role
// that migrated it), whatever EnvAppRole says, closed when the test ends.
// Tests use it for DDL they run on purpose.
func ConnectOwner(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return connect(tb, dbURL, maxConns)
}
