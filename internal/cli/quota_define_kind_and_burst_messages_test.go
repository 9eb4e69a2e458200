package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// --burst below 1 is refused with the value the user gave (where 0 said
// "got -1").
func TestQuotaDefineBurstReportsGivenValue(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	for _, burst := range []string{"0", "-3"} {
		r := runDB(t, dbURL, "quota", "define", "--name", "r", "--rate", "5/s", "--burst", burst)
		requireError(t, r, cli.ExitUsage, "--burst", "got "+burst)
		require.NotContains(t, r.stderr, "-1", burst)
	}
}

// quota define on an existing quota of another kind fails (exit 2) saying
// what a change of kind does to the counters and naming --replace-kind,
// where it switched day to rate silently; with --replace-kind it changes
// the kind and the old counters are gone.
func TestQuotaDefineKindChangeNeedsReplaceKind(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "quota", "define", "--name", "q", "--window", "day", "--limit", "10")
	ok(t, dbURL, "grant", "--quota", "q", "--member", "m", "--amount", "3")
	requireError(t, runDB(t, dbURL, "quota", "define", "--name", "q", "--rate", "5/s"), cli.ExitUsage,
		`quota "q" is of kind day, not rate`, "deletes its counters", "--replace-kind", "nothing was changed")
	out := ok(t, dbURL, "quota", "define", "--name", "q", "--rate", "5/s", "--replace-kind")
	require.Contains(t, out, "rate")
	ok(t, dbURL, "quota", "define", "--name", "q", "--window", "day", "--limit", "10", "--replace-kind")
	v := okJSON(t, dbURL, cli.ExitOK, "usage", "--quota", "q", "--member", "m").(map[string]any)
	require.Equal(t, 0.0, v["used"], "the old day counter did not come back: %v", v)
}
