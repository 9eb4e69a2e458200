package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// quota define --rate/--burst, --window <length>/--origin, --rolling; grant
// against several quotas prints the refusing quota and the retry-after,
// with snake_case JSON; bad flags are usage errors naming the flag.
func TestQuotaDefineShapesAndGrantSeveralQuotas(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	out := ok(t, dbURL, "quota", "define", "--name", "r", "--rate", "5/m", "--burst", "5")
	require.Regexp(t, `(?m)^window\s+rate$`, out)
	require.Regexp(t, `(?m)^period\s+1m0s$`, out)
	require.Regexp(t, `(?m)^burst\s+5$`, out)
	out = ok(t, dbURL, "quota", "define", "--name", "shift", "--window", "36h", "--origin", "2026-01-05T06:00:00Z", "--limit", "3")
	require.Regexp(t, `(?m)^window\s+fixed$`, out)
	require.Regexp(t, `(?m)^length\s+36h0m0s$`, out)
	out = ok(t, dbURL, "quota", "define", "--name", "roll", "--rolling", "1h", "--limit", "2")
	require.Regexp(t, `(?m)^window\s+rolling$`, out)
	ok(t, dbURL, "quota", "define", "--name", "sec", "--rate", "3/s")
	ok(t, dbURL, "quota", "define", "--name", "hour", "--window", "hour", "--limit", "2")

	for range 5 {
		ok(t, dbURL, "grant", "--quota", "r", "--member", "m")
	}
	r := runDB(t, dbURL, "grant", "--quota", "r", "--member", "m")
	require.Equal(t, cli.ExitDenied, r.code)
	require.Regexp(t, `(?m)^retry after\s+1[0-2](\.\d+)?s$`, r.stdout, "5/m: one unit each 12 s")
	require.Regexp(t, `(?m)^denied by\s+r$`, r.stdout)

	ok(t, dbURL, "grant", "--quota", "sec", "--quota", "hour", "--member", "m")
	ok(t, dbURL, "grant", "--quota", "sec", "--quota", "hour", "--member", "m")
	r = runDB(t, dbURL, "grant", "--quota", "sec", "--quota", "hour", "--member", "m")
	require.Equal(t, cli.ExitDenied, r.code)
	require.Regexp(t, `(?m)^denied by\s+hour$`, r.stdout)
	require.Regexp(t, `(?m)^limit hour\s+hour: fits no, used 2 of 2`, r.stdout)

	v := okJSON(t, dbURL, cli.ExitDenied, "grant", "--quota", "sec", "--quota", "hour", "--member", "m")
	m := v.(map[string]any)
	require.Equal(t, "hour", m["denied_by"])
	require.Greater(t, m["retry_after_ms"].(float64), float64(0))
	require.Len(t, m["limits"], 2)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "0/s"}, "--rate"},
		{[]string{"--rate", "5"}, "--rate"},
		{[]string{"--rate", "5/s", "--burst", "-1"}, "burst"},
		{[]string{"--rate", "5/s", "--burst", "0"}, "burst"},
		{[]string{"--window", "0s", "--limit", "1"}, `--window "0s"`},
		{[]string{"--window", "fortnight", "--limit", "1"}, "--window"},
		{[]string{"--window", "day", "--origin", "2026-01-01T00:00:00Z"}, "--origin"},
		{[]string{"--window", "10s", "--origin", "2026-01-01T00:00:00.0005Z"}, "origin"},
		{[]string{"--rolling", "1h", "--window", "day"}, "exactly one"},
		{[]string{"--limit", "1"}, "exactly one"},
		{[]string{"--window", "day", "--burst", "2"}, "--burst"},
		{[]string{"--rolling", "1h", "--limit", "10001"}, "default limit"},
	} {
		r := runDB(t, dbURL, append([]string{"quota", "define", "--name", "bad"}, c.args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, "%v", c.args)
	}
	requireError(t, runDB(t, dbURL, "grant", "--quota", "sec", "--quota", "nope", "--member", "m"), cli.ExitUsage, `"nope"`)
}
