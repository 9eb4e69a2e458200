package cli_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/migrations"
)

// version and --version need no database: they print the build's version
// and the schema version it needs.
func TestVersion(t *testing.T) {
	t.Parallel()
	t.Run("command", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", "postgres://nobody@127.0.0.1:1/none", "version")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
		require.Empty(t, r.stderr)
		require.Regexp(t, `(?m)^pgquota\s+(devel|v\S+)$`, r.stdout)
		require.Regexp(t, fmt.Sprintf(`(?m)^schema version\s+%d `, migrations.Latest()), r.stdout)
	})
	t.Run("json", func(t *testing.T) {
		t.Parallel()
		v := okJSON(t, "postgres://nobody@127.0.0.1:1/none", cli.ExitOK, "version").(map[string]any)
		require.Equal(t, float64(migrations.Latest()), v["schema_version"])
		require.NotEmpty(t, v["version"])
	})
	t.Run("flag", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--version")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
		require.Regexp(t, fmt.Sprintf(`^pgquota (devel|v\S+) \(go\S+\), needs schema version %d\n$`, migrations.Latest()), r.stdout)
	})
}
