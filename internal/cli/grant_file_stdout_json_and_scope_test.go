package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// `grant --file F --out - --json` writes the outcomes to stdout, and --json
// promises scripts JSON there: JSON lines, not CSV (the summary, which
// --out - leaves out, is no help).
func TestGrantFileOutStdoutJSON(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	pgqJSON(t, dbURL, 0, "quota", "define", "--name", "points", "--window", "none", "--limit", "10")
	f := filepath.Join(t.TempDir(), "r.csv")
	require.NoError(t, os.WriteFile(f, []byte("quota,member,amount\npoints,a,1\npoints,b,20\n"), 0o644))

	code, out, errOut := pgq(t, dbURL, "grant", "--file", f, "--out", "-", "--json")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	for i, want := range []string{"granted", "denied"} {
		var o map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &o), "line %d of stdout is JSON: %q", i+1, lines[i])
		require.Equal(t, want, o["status"])
	}
}

// --idempotency-scope names the namespace of --idempotency-key: given
// without a key it is bad input (exit 2, nothing written), not a silently
// unkeyed operation that a retry would repeat.
func TestIdempotencyScopeWithoutKey(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	pgqJSON(t, dbURL, 0, "quota", "define", "--name", "points", "--window", "none", "--limit", "10")
	pgqJSON(t, dbURL, 0, "voucher", "create", "--campaign", "v", "--total", "5")
	for _, args := range [][]string{
		{"grant", "--quota", "points", "--member", "a", "--idempotency-scope", "orders"},
		{"revoke", "--quota", "points", "--member", "a", "--amount", "1", "--idempotency-scope", "orders"},
		{"voucher", "claim", "--campaign", "v", "--member", "a", "--idempotency-scope", "orders"},
	} {
		code, _, errOut := pgq(t, dbURL, args...)
		require.Equal(t, cli.ExitUsage, code, "pgquota %s: %s", strings.Join(args, " "), errOut)
		require.Contains(t, errOut, "--idempotency-key")
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr")
	}
	u := pgqJSON(t, dbURL, 0, "usage", "--quota", "points", "--member", "a")
	require.Equal(t, float64(0), u["used"], "nothing granted")
	st := pgqJSON(t, dbURL, 0, "voucher", "status", "--campaign", "v")
	require.Equal(t, float64(0), st["claimed"], "nothing claimed")
}
