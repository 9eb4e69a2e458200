package cli_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// migrate down at version 0 says there is nothing to roll back and exits
// 0, without creating the schema; --to N rolls back everything above N.
func TestMigrateDownTo(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)

	out := ok(t, dbURL, "migrate", "down")
	require.Contains(t, out, "nothing to roll back (version 0)")
	requireError(t, runDB(t, dbURL, "quota", "list"), cli.ExitError, "schema is missing")
	v := okJSON(t, dbURL, cli.ExitOK, "migrate", "down").(map[string]any)
	require.Equal(t, 0.0, v["version"])

	ok(t, dbURL, "migrate", "up")
	out = ok(t, dbURL, "migrate", "down", "--to", "2")
	require.Regexp(t, `(?m)^version\s+2 \(this build needs `+strconv.FormatInt(migrations.Latest(), 10)+`\)$`, out)
	above2 := 0
	entries, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() >= "00003" {
			above2++
		}
	}
	require.Equal(t, above2, strings.Count(out, "down "), out)
	out = ok(t, dbURL, "migrate", "down", "--to", "2")
	require.Contains(t, out, "nothing to roll back (version 2, --to 2)")
	ok(t, dbURL, "migrate", "down", "--to", "0")
	out = ok(t, dbURL, "migrate", "version")
	require.Regexp(t, `(?m)^version\s+0$`, out)
	out = ok(t, dbURL, "migrate", "down")
	require.Contains(t, out, "nothing to roll back (version 0)")

	requireError(t, runDB(t, dbURL, "migrate", "down", "--to", "-1"), cli.ExitUsage, "--to")
	requireError(t, runDB(t, dbURL, "migrate", "down", "--to", "999"), cli.ExitUsage, "--to")
}

// migrate down refuses, before rolling anything back, to go below the
// migration whose guard function an application table's trigger still
// calls: it names the triggers to drop (the row and the TRUNCATE trigger),
// leaves the version where it was, and succeeds once they are dropped. A
// table still guarded by the first form (00003's pgquota.fence_guard) lets
// it roll back to the lease migration and no further.
func TestMigrateDownRefusesUpFrontWhileTablesAreGuarded(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)
	ok(t, dbURL, "migrate", "up")
	conn := pgtest.Connect(t, dbURL, 1)
	_, err := conn.Exec(context.Background(), `CREATE TABLE reports (id int PRIMARY KEY, fence_token bigint)`)
	require.NoError(t, err)
	ok(t, dbURL, "fence", "guard", "--table", "reports", "--column", "fence_token")
	latest := `(?m)^version\s+` + strconv.FormatInt(migrations.Latest(), 10) + `$`

	r := runDB(t, dbURL, "migrate", "down", "--to", "0")
	require.Equal(t, cli.ExitError, r.code, "stderr: %q", r.stderr)
	require.NotContains(t, r.stdout, "down ", "nothing was rolled back")
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "stderr is one line: %q", r.stderr)
	require.Contains(t, r.stderr, "nothing was rolled back")
	require.Contains(t, r.stderr, "run DROP TRIGGER pgquota_fence_guard ON reports; DROP TRIGGER pgquota_fence_guard_truncate ON reports; then run this again")
	require.Regexp(t, latest, ok(t, dbURL, "migrate", "version"))
	// Rolling back migrations that keep the guard's function is allowed.
	out := ok(t, dbURL, "migrate", "down", "--to", "6")
	require.Regexp(t, `(?m)^version\s+6 \(`, out)
	requireError(t, runDB(t, dbURL, "migrate", "down", "--to", "5"), cli.ExitError, "nothing was rolled back")
	require.Regexp(t, `(?m)^version\s+6$`, ok(t, dbURL, "migrate", "version"))

	_, err = conn.Exec(context.Background(), `DROP TRIGGER pgquota_fence_guard ON reports; DROP TRIGGER pgquota_fence_guard_truncate ON reports`)
	require.NoError(t, err)
	// A guard of the first form, attached by hand as older releases did.
	_, err = conn.Exec(context.Background(), `CREATE TRIGGER pgquota_fence_guard BEFORE INSERT OR UPDATE ON reports
		FOR EACH ROW EXECUTE FUNCTION pgquota.fence_guard('fence_token', 'public.reports')`)
	require.NoError(t, err)
	r = runDB(t, dbURL, "migrate", "down", "--to", "0")
	require.Equal(t, cli.ExitError, r.code, "stderr: %q", r.stderr)
	require.NotContains(t, r.stdout, "down ")
	require.Contains(t, r.stderr, "run DROP TRIGGER pgquota_fence_guard ON reports; then run this again")
	out = ok(t, dbURL, "migrate", "down", "--to", "3")
	require.Regexp(t, `(?m)^version\s+3 \(`, out)

	_, err = conn.Exec(context.Background(), `DROP TRIGGER pgquota_fence_guard ON reports`)
	require.NoError(t, err)
	out = ok(t, dbURL, "migrate", "down", "--to", "0")
	require.Regexp(t, `(?m)^version\s+0 \(`, out)
}
