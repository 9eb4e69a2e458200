package cli_test

import (
	"testing"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// pgquota revoke on a rate, fixed or rolling quota exits with status 2 and
// one line naming the quota's kind and what it serves.
func TestRevokeShapedQuotaCLI(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "quota", "define", "--name", "r", "--rate", "10/m")
	ok(t, dbURL, "quota", "define", "--name", "f", "--window", "90s", "--limit", "5")
	ok(t, dbURL, "quota", "define", "--name", "w", "--rolling", "1h", "--limit", "5")
	for q, kind := range map[string]string{"r": "rate", "f": "fixed", "w": "rolling"} {
		requireError(t, runDB(t, dbURL, "revoke", "--quota", q, "--member", "m", "--amount", "1"), cli.ExitUsage, "of kind "+kind, "revoke serves calendar quotas only")
	}
}
