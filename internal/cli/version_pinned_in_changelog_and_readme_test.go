package cli_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
)

// The version is written down once (cli.Version); the CHANGELOG has a
// section for it and the README's install lines pin it, so a release that
// bumps the const and forgets either fails here.
func TestVersionIsPinnedInChangelogAndReadme(t *testing.T) {
	t.Parallel()
	number := strings.TrimPrefix(cli.Version, "v")

	changelog, err := os.ReadFile("../../CHANGELOG.md")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^## \[`+regexp.QuoteMeta(number)+`\] - \d{4}-\d{2}-\d{2}$`, string(changelog),
		"CHANGELOG.md has no section for %s", number)

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, line := range []string{
		"go install github.com/pgquota/pgquota/cmd/pgquota@" + cli.Version,
		"go get github.com/pgquota/pgquota@" + cli.Version,
	} {
		require.Contains(t, string(readme), line)
	}
}
