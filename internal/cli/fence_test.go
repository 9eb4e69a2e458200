package cli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// fence write checks the token against the lease named like the resource
// unless --lease names another one; when that check fails, the error says
// so once, and says which flags change it.
func TestFenceWriteLeaseName(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	tok := fmt.Sprint(acquireJSON(t, dbURL, "--name", "nightly", "--ttl", "1m"))

	r := runDB(t, dbURL, "fence", "write", "--resource", "report", "--key", "k", "--token", tok, "--value", "v")
	requireError(t, r, cli.ExitDenied, "lease report is not held with token "+tok, "SQLSTATE PQ002",
		`the lease held now under the name "report" (--lease defaults to --resource)`, "--lease NAME", "--external")
	require.Equal(t, 1, strings.Count(r.stderr, "not held with token"), "said once: %q", r.stderr)

	// --lease names the lease: the write lands.
	out := ok(t, dbURL, "fence", "write", "--resource", "report", "--lease", "nightly", "--key", "k", "--token", tok, "--value", "v")
	require.Regexp(t, `(?m)^written\s+yes$`, out)

	// With --lease given, no hint about it.
	r = runDB(t, dbURL, "fence", "write", "--resource", "report", "--lease", "other", "--key", "k", "--token", tok, "--value", "v")
	requireError(t, r, cli.ExitDenied, "lease other is not held with token "+tok)
	require.NotContains(t, r.stderr, "--lease defaults")

	help := run(t, "fence", "write", "--help")
	require.Equal(t, cli.ExitOK, help.code)
	require.Contains(t, help.stdout, `--resource report checks
lease "report"`)
	require.Contains(t, help.stdout, "PQ002")
}
