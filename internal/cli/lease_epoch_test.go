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

	require.Equal(t, before>>40+1, epoch("bump", "--no-standbys"))
	require.Equal(t, int64(9), epoch("bump", "--no-standbys", "--min-epoch", "9"))
	after := acquireJSON(t, dbURL, "--name", "other")
	require.Equal(t, int64(9), after>>40)
	require.Greater(t, after, before)

	code, _, errOut := runLease(t, dbURL, "lease", "epoch", "bump", "--min-epoch", "-1")
	require.Equal(t, cli.ExitUsage, code, errOut)
}

// TestCLILeaseEpochBumpRefusesWithoutTheStandbysItNeeds: on a server that
// sees no standby a bump without --no-standbys, and one with --standbys 1,
// exits 1 naming what is missing and raises nothing; --no-standbys and
// --unconfirmed raise; bad --timeout and --standbys values are usage
// errors.
func TestCLILeaseEpochBumpRefusesWithoutTheStandbysItNeeds(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	epoch := func(args ...string) (int, int64, string) {
		t.Helper()
		code, out, errOut := runLease(t, dbURL, append([]string{"lease", "epoch", "--json"}, args...)...)
		var e struct {
			Epoch int64 `json:"epoch"`
		}
		if code == cli.ExitOK {
			require.NoError(t, json.Unmarshal([]byte(out), &e), out)
		}
		return code, e.Epoch, errOut
	}
	_, before, _ := epoch()
	code, _, errOut := epoch("bump", "--timeout", "200ms")
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "the primary sees no standby")
	require.Contains(t, errOut, "--no-standbys")
	code, _, errOut = epoch("bump", "--standbys", "1", "--timeout", "200ms")
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "lease epoch not raised to ")
	require.Contains(t, errOut, "the primary sees no standby")
	require.Contains(t, errOut, "--unconfirmed")
	_, now, _ := epoch()
	require.Equal(t, before, now, "nothing raised")

	code, now, errOut = epoch("bump", "--standbys", "1", "--timeout", "200ms", "--unconfirmed")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, before+1, now)
	code, now, errOut = epoch("bump", "--no-standbys")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, before+2, now)

	for _, bad := range [][]string{{"--timeout", "0s"}, {"--timeout", "-1s"}, {"--standbys", "-1"}, {"--standbys", "1", "--no-standbys"}} {
		code, _, errOut := runLease(t, dbURL, append([]string{"lease", "epoch", "bump"}, bad...)...)
		require.Equal(t, cli.ExitUsage, code, "%v: %s", bad, errOut)
	}
}
