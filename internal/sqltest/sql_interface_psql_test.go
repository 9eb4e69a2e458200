package sqltest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pgquota/pgquota/internal/pgtest"
)

// pgTool returns the path of PostgreSQL client program name (psql,
// pgbench): from PATH, else from $PGQUOTA_PG_BIN. A missing program fails
// the test, saying where it was looked for.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if dir := os.Getenv("PGQUOTA_PG_BIN"); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("sqltest: %s not found on PATH nor in $PGQUOTA_PG_BIN (%q): install the PostgreSQL client programs "+
		"(e.g. apt-get install postgresql-client-15) or set PGQUOTA_PG_BIN=/usr/lib/postgresql/15/bin", name, os.Getenv("PGQUOTA_PG_BIN"))
	return ""
}

// run runs a PostgreSQL client program and returns its combined output;
// a non-zero exit fails the test with that output.
func run(t *testing.T, prog string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), prog, args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=30")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(prog), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Every testdata/*.sql script runs without error on its own freshly
// migrated database: the scripts check the outcomes of the SQL functions
// and fail by RAISE EXCEPTION (ON_ERROR_STOP makes psql exit 3).
func TestSQLInterfaceFromPsql(t *testing.T) {
	t.Parallel()
	psql := pgTool(t, "psql")
	scripts, err := filepath.Glob(filepath.Join("testdata", "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if len(scripts) == 0 {
		t.Fatal("sqltest: no testdata/*.sql scripts")
	}
	for _, script := range scripts {
		t.Run(filepath.Base(script), func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.NewURL(t)
			out := run(t, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dbURL, "-f", script)
			t.Logf("psql -f %s:\n%s", script, out)
		})
	}
}

var processed = regexp.MustCompile(`number of transactions actually processed: (\d+)/(\d+)`)

// pgbench races 20 clients x 5 calls of pgquota.grant for one member of a
// quota of limit 5: exactly 5 calls are granted and the counter ends at
// exactly 5, as the schema's owner and as the application role
// (pgquota_app, through a login role that is only its member).
func TestSQLGrantRaceFromPgbench(t *testing.T) {
	t.Parallel()
	pgbench := pgTool(t, "pgbench")
	psql := pgTool(t, "psql")
	for _, as := range []string{"owner", "app role"} {
		t.Run(as, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.NewURL(t)
			// A lifetime quota: no window boundary can fall inside the run.
			run(t, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dbURL, "-c", `
INSERT INTO pgquota.quota (name, window_unit, default_limit) VALUES ('v', 'none', 5);
CREATE TABLE public.grant_log (granted boolean NOT NULL);
GRANT INSERT ON public.grant_log TO PUBLIC;`)
			callURL := dbURL
			if as == "app role" {
				callURL = pgtest.AppURL(t, dbURL)
			}
			script := filepath.Join(t.TempDir(), "grant.sql")
			if err := os.WriteFile(script, []byte("INSERT INTO public.grant_log SELECT granted FROM pgquota.grant('v', 'm', 1);\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out := run(t, pgbench, "-n", "--max-tries=1000", "-c", "20", "-j", "4", "-t", "5", "-f", script, callURL)
			m := processed.FindStringSubmatch(out)
			if m == nil || m[1] != "100" || m[2] != "100" {
				t.Fatalf("pgbench did not run 100 transactions:\n%s", out)
			}
			got := strings.TrimSpace(run(t, psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dbURL, "-c", `
SELECT (SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = 'v' AND member = 'm') || ' ' ||
       (SELECT count(*) FILTER (WHERE granted) FROM public.grant_log) || ' ' ||
       (SELECT count(*) FROM public.grant_log)`))
			if want := "5 5 100"; got != want {
				t.Fatalf("counter, granted calls, calls: got %q, want %q", got, want)
			}
			t.Logf("as %s: 100 concurrent calls, 5 granted, counter 5", as)
		})
	}
}
