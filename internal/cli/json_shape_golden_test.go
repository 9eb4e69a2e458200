package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// keyPaths lists every key of a decoded JSON value as a path (a.b, a[].b),
// sorted, so that a nested object's keys are pinned too.
func keyPaths(prefix string, v any, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			into[prefix+k] = true
			keyPaths(prefix+k+".", e, into)
		}
	case []any:
		for _, e := range v {
			keyPaths(strings.TrimSuffix(prefix, ".")+"[].", e, into)
		}
	}
}

// Each command's --json output has exactly the keys of
// testdata/json_keys.golden, whatever the outcome (granted or denied, keyed
// or not): every field is always present (false, 0, "" or null), and one
// concept has one name across commands (quota, token). An error is one
// object on stderr with code, exit_status, message and sqlstate.
// PGQUOTA_UPDATE_GOLDEN=1 rewrites the file.
func TestJSONShapeGoldenKeys(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	file := filepath.Join(t.TempDir(), "codes.txt")
	require.NoError(t, os.WriteFile(file, []byte("x\ny\n"), 0o600))
	ok(t, dbURL, "quota", "define", "--name", "rt", "--rate", "5/m", "--burst", "2")
	// demo connects to the server and makes a database of its own: a
	// name of this test's, dropped at the end.
	base := pgtest.BaseURL(t)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	demoDB := "pgquota_demo_golden_" + hex.EncodeToString(suffix)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, base)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{demoDB}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	cases := []struct {
		name string
		code int
		args []string
		url  string // the --database-url when not dbURL
	}{
		{"grant", cli.ExitOK, []string{"grant", "--quota", "lim", "--member", "m"}, ""},
		{"grant keyed", cli.ExitOK, []string{"grant", "--quota", "lim", "--member", "m", "--idempotency-key", "k1"}, ""},
		{"grant denied", cli.ExitDenied, []string{"grant", "--quota", "lim", "--member", "m"}, ""},
		{"usage", cli.ExitOK, []string{"usage", "--quota", "lim", "--member", "m"}, ""},
		{"revoke", cli.ExitOK, []string{"revoke", "--quota", "lim", "--member", "m", "--amount", "1"}, ""},
		{"quota define", cli.ExitOK, []string{"quota", "define", "--name", "tz", "--window", "week"}, ""},
		{"quota list", cli.ExitOK, []string{"quota", "list"}, ""},
		{"voucher create", cli.ExitOK, []string{"voucher", "create", "--campaign", "bf", "--total", "1"}, ""},
		{"voucher claim", cli.ExitOK, []string{"voucher", "claim", "--campaign", "bf", "--member", "m"}, ""},
		{"voucher claim sold out", cli.ExitDenied, []string{"voucher", "claim", "--campaign", "bf", "--member", "o"}, ""},
		{"voucher status", cli.ExitOK, []string{"voucher", "status", "--campaign", "bf"}, ""},
		{"voucher import", cli.ExitOK, []string{"voucher", "import", "--campaign", "codes", "--file", file}, ""},
		{"voucher claim code", cli.ExitOK, []string{"voucher", "claim", "--campaign", "codes", "--member", "m"}, ""},
		{"lease acquire", cli.ExitOK, []string{"lease", "acquire", "--name", "report", "--ttl", "1m"}, ""},
		{"lease show", cli.ExitOK, []string{"lease", "show", "--name", "report"}, ""},
		{"fence write", cli.ExitOK, []string{"fence", "write", "--resource", "ext", "--key", "k", "--token", "5", "--value", "v", "--external"}, ""},
		{"fence show", cli.ExitOK, []string{"fence", "show", "--resource", "ext"}, ""},
		{"migrate version", cli.ExitOK, []string{"migrate", "version"}, ""},
		{"slot acquire", cli.ExitOK, []string{"slot", "acquire", "--name", "sem", "--limit", "2", "--ttl", "1m"}, ""},
		{"slot show", cli.ExitOK, []string{"slot", "show", "--name", "sem"}, ""},
		{"grant rate", cli.ExitOK, []string{"grant", "--quota", "rt", "--member", "m"}, ""},
		{"usage rate", cli.ExitOK, []string{"usage", "--quota", "rt", "--member", "m"}, ""},
		{"demo", cli.ExitOK, []string{"demo", "--demo-database", demoDB}, base},
	}
	var got strings.Builder
	for _, tc := range cases {
		url := dbURL
		if tc.url != "" {
			url = tc.url
		}
		v := okJSON(t, url, tc.code, tc.args...)
		keys := map[string]bool{}
		keyPaths("", v, keys)
		var list []string
		for k := range keys {
			list = append(list, k)
		}
		sort.Strings(list)
		fmt.Fprintf(&got, "%s: %s\n", tc.name, strings.Join(list, " "))
	}
	r := runDB(t, dbURL, "--json", "grant", "--quota", "nope", "--member", "m")
	require.Equal(t, cli.ExitUsage, r.code)
	require.Empty(t, r.stdout)
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stderr), &e), "stderr %q", r.stderr)
	require.Equal(t, 1, strings.Count(strings.TrimSpace(r.stderr), "\n")+1, "one line")
	require.Equal(t, "usage", e["code"])
	require.Equal(t, 2.0, e["exit_status"])
	require.Contains(t, e["message"], "quota not found")
	require.Equal(t, "PQ010", e["sqlstate"], "an unknown quota is PQ010 on every surface (pgquota.grant raises it in SQL)")
	// A mistake the CLI catches itself carries a null sqlstate.
	r2 := runDB(t, dbURL, "--json", "grant", "--quota", "nope", "--member", "")
	require.Equal(t, cli.ExitUsage, r2.code)
	var e2 map[string]any
	require.NoError(t, json.Unmarshal([]byte(r2.stderr), &e2), "stderr %q", r2.stderr)
	require.Contains(t, e2, "sqlstate")
	require.Nil(t, e2["sqlstate"])
	keys := map[string]bool{}
	keyPaths("", e, keys)
	var list []string
	for k := range keys {
		list = append(list, k)
	}
	sort.Strings(list)
	fmt.Fprintf(&got, "error: %s\n", strings.Join(list, " "))

	golden := filepath.Join("testdata", "json_keys.golden")
	if os.Getenv("PGQUOTA_UPDATE_GOLDEN") == "1" {
		require.NoError(t, os.WriteFile(golden, []byte(got.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run with PGQUOTA_UPDATE_GOLDEN=1 once to create it")
	require.Equal(t, string(want), got.String())
}
