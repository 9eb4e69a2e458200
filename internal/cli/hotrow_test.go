package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
)

// writeFile writes content to a file in a test's temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestGrantFile(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t) // q: no default limit; lim: default limit 2
	file := writeFile(t, "requests.csv", "quota,member,amount,limit\n"+
		"lim,a,1,\n"+ // 2: granted (1 of 2)
		"lim,a,1,\n"+ // 3: granted (2 of 2)
		"lim,a,1,\n"+ // 4: denied
		"q,b,5,10\n"+ // 5: granted
		"q,c,1,\n"+ // 6: no limit
		"lim,d,x,\n"+ // 7: bad amount
		"nope,e,1,5\n") // 8: undefined quota

	out := filepath.Join(t.TempDir(), "results.csv")
	r := runDB(t, dbURL, "grant", "--file", file, "--out", out)
	require.Equal(t, cli.ExitUsage, r.code, "some rows had errors: stderr %q", r.stderr)
	require.Regexp(t, `(?m)^rows\s+7$`, r.stdout)
	require.Regexp(t, `(?m)^granted\s+3$`, r.stdout)
	require.Regexp(t, `(?m)^denied\s+1$`, r.stdout)
	require.Regexp(t, `(?m)^errors\s+3$`, r.stdout)
	for _, want := range []string{"line 6: no limit", "line 7: amount", "line 8: quota not found", "3 of 7 rows had errors"} {
		require.Contains(t, r.stderr, want)
	}
	results, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "line,quota,member,amount,idempotency_key,status,used,limit,remaining,grant_id,replayed,error\n"+
		"2,lim,a,1,,granted,1,2,1,,,\n"+
		"3,lim,a,1,,granted,2,2,0,,,\n"+
		"4,lim,a,1,,denied,2,2,0,,,\n"+
		"5,q,b,5,,granted,5,10,5,,,\n", strings.Join(strings.SplitAfter(string(results), "\n")[:5], ""))
	// Error rows: no counter values, and no amount when it did not parse.
	require.Contains(t, string(results), "\n6,q,c,1,,error,,,,,,")
	require.Contains(t, string(results), "\n7,lim,d,,,error,,,,,,\"amount: not an integer: \"\"x\"\"\"\n")
	require.Contains(t, string(results), "\n8,nope,e,1,,error,,,,,,\"quota not found")

	// The counters hold exactly the granted rows.
	out2 := ok(t, dbURL, "usage", "--quota", "lim", "--member", "a")
	require.Regexp(t, `(?m)^used\s+2$`, out2)

	// A clean file exits 0; the summary goes to stdout (--json), the
	// outcomes to a .jsonl file as JSON lines.
	clean := writeFile(t, "clean.csv", "member,quota,amount\nx,lim,1\ny,lim,3\n")
	jl := filepath.Join(t.TempDir(), "out.jsonl")
	r = runDB(t, dbURL, "--json", "grant", "--file", clean, "--out", jl)
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	require.Empty(t, r.stderr)
	var sum map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &sum))
	require.Equal(t, float64(2), sum["rows"])
	require.Equal(t, float64(1), sum["granted"])
	require.Equal(t, float64(1), sum["denied"])
	lines, err := os.ReadFile(jl)
	require.NoError(t, err)
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.SplitN(string(lines), "\n", 2)[0]), &first))
	require.Equal(t, "granted", first["status"])
	require.Equal(t, float64(2), first["line"])

	// --out - writes the outcomes to stdout, with no summary there: it
	// goes to stderr.
	r = runDB(t, dbURL, "grant", "--file", clean, "--out", "-", "--out-format", "jsonl")
	require.Equal(t, cli.ExitOK, r.code)
	require.Equal(t, 2, strings.Count(r.stdout, "\n"))
	require.Contains(t, r.stdout, `"status":"denied"`)
	require.Regexp(t, `^pgquota: `+regexp.QuoteMeta(clean)+`: 2 rows: 1 granted, 1 denied, 0 errors; \d+ batches in \S+s \(\d+ rows/s\)\n$`, r.stderr)
}

func TestGrantFileUsageErrors(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	file := writeFile(t, "f.csv", "quota,member,amount\nlim,a,1\n")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"file and quota", []string{"grant", "--file", file, "--quota", "q"}, []string{"--quota cannot be used with --file"}},
		{"out without file", []string{"grant", "--quota", "q", "--member", "m", "--out", "x.csv"}, []string{"--out needs --file"}},
		{"neither", []string{"grant"}, []string{"required flag", "member", "quota"}},
		{"missing file", []string{"grant", "--file", filepath.Join(t.TempDir(), "nope.csv")}, []string{"--file", "no such file"}},
		{"bad header", []string{"grant", "--file", writeFile(t, "h.csv", "quota,member\n")}, []string{"amount", "missing"}},
		{"bad format", []string{"grant", "--file", file, "--out", "x", "--out-format", "xml"}, []string{"--out-format"}},
		{"bad batch size", []string{"grant", "--file", file, "--batch-size", "0"}, []string{"--batch-size"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireError(t, runDB(t, dbURL, tc.args...), cli.ExitUsage, tc.want...)
		})
	}
}

func TestVoucherCreateShards(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	out := ok(t, dbURL, "voucher", "create", "--campaign", "flash", "--total", "10", "--shards", "4")
	require.Regexp(t, `(?m)^kind\s+sharded$`, out)
	require.Regexp(t, `(?m)^shards\s+4$`, out)
	for _, m := range []string{"a", "b", "c"} {
		ok(t, dbURL, "voucher", "claim", "--campaign", "flash", "--member", m)
	}
	out = ok(t, dbURL, "voucher", "status", "--campaign", "flash")
	require.Regexp(t, `(?m)^claimed\s+3$`, out)
	require.Regexp(t, `(?m)^remaining\s+7$`, out)
	requireError(t, runDB(t, dbURL, "voucher", "create", "--campaign", "x", "--total", "3", "--shards", "5"), cli.ExitUsage, "shards")
	requireError(t, runDB(t, dbURL, "voucher", "create", "--campaign", "x", "--total", "3", "--shards", "0"), cli.ExitUsage, "--shards")
	requireError(t, runDB(t, dbURL, "voucher", "create", "--campaign", "flash", "--total", "10", "--shards", "5"), cli.ExitUsage, "already exists")
}

func TestGrantFileIdempotencyKeys(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t) // lim: default limit 2
	file := writeFile(t, "keyed.csv", "quota,member,amount,idempotency_key\n"+
		"lim,a,1,order-1\n"+
		"lim,a,1,order-2\n"+
		"lim,a,1,order-3\n"+ // denied, and stored as such
		"lim,b,1,\n") // no key: granted again on every run
	out := filepath.Join(t.TempDir(), "first.jsonl")
	r := runDB(t, dbURL, "grant", "--file", file, "--out", out)
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	first := readOutcomes(t, out)
	require.Equal(t, []string{"granted", "granted", "denied", "granted"}, statuses(first))
	for _, o := range first[:3] {
		require.Positive(t, o["grant_id"])
		require.Equal(t, false, o["replayed"])
	}
	// The same file again: the keyed rows replay their first outcomes.
	out2 := filepath.Join(t.TempDir(), "second.jsonl")
	r = runDB(t, dbURL, "grant", "--file", file, "--out", out2)
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	second := readOutcomes(t, out2)
	require.Equal(t, []string{"granted", "granted", "denied", "granted"}, statuses(second))
	for i, o := range second[:3] {
		require.Equal(t, true, o["replayed"])
		require.Equal(t, first[i]["grant_id"], o["grant_id"])
		require.Equal(t, first[i]["used"], o["used"])
	}
	require.Regexp(t, `(?m)^used\s+2$`, ok(t, dbURL, "usage", "--quota", "lim", "--member", "a"))
	require.Regexp(t, `(?m)^used\s+2$`, ok(t, dbURL, "usage", "--quota", "lim", "--member", "b"))
	// `pgquota ledger show` finds a row's entry by its key.
	show := ok(t, dbURL, "ledger", "show", "--key", "order-1", "--scope", "lim")
	require.Regexp(t, `(?m)^granted\s+yes$`, show)
}

func readOutcomes(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var o map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &o))
		out = append(out, o)
	}
	return out
}

func statuses(os []map[string]any) []string {
	var s []string
	for _, o := range os {
		s = append(s, o["status"].(string))
	}
	return s
}
