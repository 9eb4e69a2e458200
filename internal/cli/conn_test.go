package cli_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// Errors that depend on where pgquota connected (a missing schema, a failed
// connection) name the database, host and user it used and where those
// settings came from, and never the password.
func TestErrorsNameTheDatabase(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	name := strings.TrimPrefix(u.Path, "/")

	r := runDB(t, dbURL, "quota", "list")
	requireError(t, r, cli.ExitError, "schema is missing in database \""+name+"\" on "+u.Host+" as user "+u.User.Username()+
		" (from --database-url): run pgquota migrate up there, or point --database-url at your database")

	// migrate status and version read the version without creating
	// anything, so the schema is still missing afterwards.
	out := ok(t, dbURL, "migrate", "version")
	require.Regexp(t, `(?m)^database\s+"`+name+`" on `+u.Host+` as user `, out)
	require.Regexp(t, `(?m)^version\s+0$`, out)
	out = ok(t, dbURL, "migrate", "status")
	require.Equal(t, int(migrations.Latest()), strings.Count(out, "pending"), out)
	requireError(t, runDB(t, dbURL, "quota", "list"), cli.ExitError, "schema is missing in database \""+name+"\"")

	out = ok(t, dbURL, "migrate", "up")
	require.Regexp(t, `(?m)^database\s+"`+name+`" on `+u.Host+` as user `+u.User.Username()+` \(from --database-url\)$`, out)

	// A refused connection, with a password in the URL.
	r = run(t, "--database-url", "postgres://alice:s3cret@127.0.0.1:1/shop?sslmode=disable", "quota", "list")
	requireError(t, r, cli.ExitError, `cannot connect to database "shop" on 127.0.0.1:1 as user alice (from --database-url)`, "connection refused")
	require.NotContains(t, r.stderr, "s3cret")
	require.Equal(t, 1, strings.Count(r.stderr, "connection refused"), "said once: %q", r.stderr)

	// A role the server does not know: the server's own words.
	stranger := *u
	stranger.User = url.UserPassword("pgquota_no_such_role", "s3cret")
	r = runDB(t, stranger.String(), "quota", "list")
	requireError(t, r, cli.ExitError, `as user pgquota_no_such_role`, `role "pgquota_no_such_role" does not exist`, "28000")
	require.NotContains(t, r.stderr, "s3cret")
}

// With DATABASE_URL or the PG* variables, the error says so. (No
// t.Parallel: t.Setenv.)
func TestErrorsNameTheSettingsSource(t *testing.T) {
	dbURL := pgtest.NewEmptyURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	name := strings.TrimPrefix(u.Path, "/")

	t.Setenv("DATABASE_URL", dbURL)
	requireError(t, run(t, "quota", "list"), cli.ExitError, `database "`+name+`"`, "(from DATABASE_URL)")

	t.Setenv("DATABASE_URL", "")
	pass, _ := u.User.Password()
	t.Setenv("PGHOST", u.Hostname())
	t.Setenv("PGPORT", u.Port())
	t.Setenv("PGUSER", u.User.Username())
	t.Setenv("PGPASSWORD", pass)
	t.Setenv("PGDATABASE", name)
	t.Setenv("PGSSLMODE", "disable")
	t.Setenv("PGSERVICE", "")
	t.Setenv("PGHOSTADDR", "")
	requireError(t, run(t, "quota", "list"), cli.ExitError, `database "`+name+`" on `+u.Host,
		"(from PGHOST, PGPORT, PGDATABASE, PGUSER, libpq defaults for the rest)")
}
