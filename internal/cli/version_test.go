package cli_test

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/migrations"
)

// version and --version need no database: they print the build's version
// and the schema version it needs. A test binary is no tagged release, so
// it reports cli.Version with "+devel".
func TestVersion(t *testing.T) {
	t.Parallel()
	t.Run("command", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", "postgres://nobody@127.0.0.1:1/none", "version")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
		require.Empty(t, r.stderr)
		require.Regexp(t, `(?m)^pgquota\s+`+regexp.QuoteMeta(cli.Version+"+devel")+`$`, r.stdout)
		require.Regexp(t, fmt.Sprintf(`(?m)^schema version\s+%d `, migrations.Latest()), r.stdout)
	})
	t.Run("json", func(t *testing.T) {
		t.Parallel()
		v := okJSON(t, "postgres://nobody@127.0.0.1:1/none", cli.ExitOK, "version").(map[string]any)
		require.Equal(t, float64(migrations.Latest()), v["schema_version"])
		require.Equal(t, cli.Version+"+devel", v["version"])
	})
	t.Run("flag", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--version")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
		require.Regexp(t, fmt.Sprintf(`^pgquota %s \(go\S+\), needs schema version %d\n$`, regexp.QuoteMeta(cli.Version+"+devel"), migrations.Latest()), r.stdout)
	})
}
