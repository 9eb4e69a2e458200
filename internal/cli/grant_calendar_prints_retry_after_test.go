package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// A calendar grant prints its retry-after and reset-after like a rate's: 0s
// when granted, the time to the window's end on a denial (under an hour for
// an hourly window), never for a full lifetime counter.
func TestGrantCalendarPrintsRetryAfter(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "quota", "define", "--name", "h", "--window", "hour", "--limit", "1")
	ok(t, dbURL, "quota", "define", "--name", "life", "--window", "none", "--limit", "1")

	out := ok(t, dbURL, "grant", "--quota", "h", "--member", "m")
	require.Regexp(t, `(?m)^retry after\s+0s$`, out)
	require.Regexp(t, `(?m)^reset after\s+[0-5]?\dm[0-5]?\d(\.\d+)?s$`, out, "an hourly window ends within the hour")

	r := runDB(t, dbURL, "grant", "--quota", "h", "--member", "m")
	require.Equal(t, cli.ExitDenied, r.code)
	require.Regexp(t, `(?m)^retry after\s+[0-5]?\dm[0-5]?\d(\.\d+)?s$`, r.stdout, "a denial waits for the window's end")

	v, _ := okJSON(t, dbURL, cli.ExitDenied, "grant", "--quota", "h", "--member", "m").(map[string]any)
	retry, _ := v["retry_after_ms"].(float64)
	require.Greater(t, retry, 0.0)
	require.LessOrEqual(t, retry, 3600000.0)

	ok(t, dbURL, "grant", "--quota", "life", "--member", "m")
	r = runDB(t, dbURL, "grant", "--quota", "life", "--member", "m")
	require.Equal(t, cli.ExitDenied, r.code)
	require.Regexp(t, `(?m)^retry after\s+never$`, r.stdout)
}
