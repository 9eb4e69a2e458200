package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pgquota/pgquota/internal/cli"
)

// PGSERVICE naming a service that no service file has: the error names the
// service and the file looked in and says how to fix it, not "invalid
// connection string"; nothing is connected to (exit 2).
func TestPGServiceMissingNamesTheServiceFile(t *testing.T) {
	for _, env := range []string{"DATABASE_URL", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGSYSCONFDIR"} {
		t.Setenv(env, "")
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("PGSERVICE", "billing")
	t.Setenv("PGSERVICEFILE", "")
	r := run(t, "usage", "--quota", "q", "--member", "m")
	requireError(t, r, cli.ExitUsage, "PGSERVICE=billing", "service file", ".pg_service.conf", "[billing] section")

	file := filepath.Join(t.TempDir(), "pg_service.conf")
	if err := os.WriteFile(file, []byte("[other]\nhost=localhost\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGSERVICEFILE", file)
	r = run(t, "usage", "--quota", "q", "--member", "m")
	requireError(t, r, cli.ExitUsage, "PGSERVICE=billing", file+" (PGSERVICEFILE)", "unable to find service: billing")
}
