package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// TestCLILeaseEpochBumpRaisesLaterTokens: `lease epoch` shows the epoch the
// next token carries, `lease epoch bump` raises it, and a token acquired
// after the bump carries the new epoch and exceeds the one before.
func TestCLILeaseEpochBumpRaisesLaterTokens(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	epoch := func(args ...string) int64 {
		t.Helper()
		code, out, errOut := runLease(t, dbURL, append([]string{"lease", "epoch", "--json"}, args...)...)
		require.Equal(t, cli.ExitOK, code, errOut)
		var e struct {
			Epoch int64 `json:"epoch"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &e), out)
		return e.Epoch
	}
	before := acquireJSON(t, dbURL, "--name", "report")
	require.Equal(t, epoch(), before>>40)

	require.Equal(t, before>>40+1, epoch("bump"))
	require.Equal(t, int64(9), epoch("bump", "--min-epoch", "9"))
	after := acquireJSON(t, dbURL, "--name", "other")
	require.Equal(t, int64(9), after>>40)
	require.Greater(t, after, before)

	code, _, errOut := runLease(t, dbURL, "lease", "epoch", "bump", "--min-epoch", "-1")
	require.Equal(t, cli.ExitUsage, code, errOut)
}
