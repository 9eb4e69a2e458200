package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

type result struct {
	code           int
	stdout, stderr string
}

// run calls cli.Run with args and buffers.
func run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := cli.Run(ctx, args, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// runDB runs a command against the database at dbURL.
func runDB(t *testing.T, dbURL string, args ...string) result {
	t.Helper()
	return run(t, append([]string{"--database-url", dbURL}, args...)...)
}

// ok runs a command that must succeed and returns its stdout.
func ok(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	r := runDB(t, dbURL, args...)
	require.Equal(t, cli.ExitOK, r.code, "pgquota %s: stderr %q", strings.Join(args, " "), r.stderr)
	require.Empty(t, r.stderr)
	return r.stdout
}

// requireError checks a failed run: its exit status, nothing on stdout, and
// exactly one line on stderr that starts with "pgquota: " and contains
// every one of want.
func requireError(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	require.Equal(t, code, r.code, "stderr: %q", r.stderr)
	require.Empty(t, r.stdout)
	require.True(t, strings.HasPrefix(r.stderr, "pgquota: "), "stderr %q starts with \"pgquota: \"", r.stderr)
	require.True(t, strings.HasSuffix(r.stderr, "\n"), "stderr %q ends with a newline", r.stderr)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "stderr is one line: %q", r.stderr)
	require.NotContains(t, r.stderr, "\r")
	require.Equal(t, 1, strings.Count(r.stderr, "pgquota: "), "one pgquota: prefix: %q", r.stderr)
	for _, w := range want {
		require.Contains(t, r.stderr, w)
	}
}

// migratedURL returns a fresh database with quota q (day, no default limit)
// and quota lim (day, default limit 2).
func migratedURL(t *testing.T) string {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "quota", "define", "--name", "q", "--window", "day")
	ok(t, dbURL, "quota", "define", "--name", "lim", "--window", "day", "--limit", "2")
	return dbURL
}

func TestGrantExitCodes(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)

	out := ok(t, dbURL, "grant", "--quota", "q", "--member", "m", "--limit", "1")
	require.Regexp(t, `(?m)^granted\s+yes$`, out)
	require.Regexp(t, `(?m)^used\s+1$`, out)

	r := runDB(t, dbURL, "grant", "--quota", "q", "--member", "m", "--limit", "1")
	require.Equal(t, cli.ExitDenied, r.code)
	require.Empty(t, r.stderr, "a denial is a result, not an error")
	require.Regexp(t, `(?m)^granted\s+no$`, r.stdout)
	require.Regexp(t, `(?m)^remaining\s+0$`, r.stdout)

	// The quota's default limit, and --amount.
	ok(t, dbURL, "grant", "--quota", "lim", "--member", "m", "--amount", "2")
	r = runDB(t, dbURL, "grant", "--quota", "lim", "--member", "m")
	require.Equal(t, cli.ExitDenied, r.code)
	// Limit 0 denies; it is not bad input.
	r = runDB(t, dbURL, "grant", "--quota", "q", "--member", "zero", "--limit", "0")
	require.Equal(t, cli.ExitDenied, r.code)
	require.Empty(t, r.stderr)

	// revoke and usage.
	out = ok(t, dbURL, "revoke", "--quota", "lim", "--member", "m", "--amount", "5")
	require.Regexp(t, `(?m)^revoked\s+2$`, out)
	out = ok(t, dbURL, "usage", "--quota", "lim", "--member", "m")
	require.Regexp(t, `(?m)^used\s+0$`, out)
	require.Regexp(t, `(?m)^remaining\s+2$`, out)

	// Member limits.
	ok(t, dbURL, "quota", "set-limit", "--name", "q", "--member", "vip", "--limit", "1")
	ok(t, dbURL, "grant", "--quota", "q", "--member", "vip")
	require.Equal(t, cli.ExitDenied, runDB(t, dbURL, "grant", "--quota", "q", "--member", "vip").code)
	ok(t, dbURL, "quota", "set-limit", "--name", "q", "--member", "vip", "--clear")
	requireError(t, runDB(t, dbURL, "grant", "--quota", "q", "--member", "vip"), cli.ExitUsage, "no limit")
}

func TestVoucherCommands(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)

	ok(t, dbURL, "voucher", "create", "--campaign", "bf", "--total", "1")
	out := ok(t, dbURL, "voucher", "claim", "--campaign", "bf", "--member", "alice")
	require.Regexp(t, `(?m)^claimed\s+yes$`, out)
	require.Regexp(t, `(?m)^unit\s+1 of 1$`, out)
	out = ok(t, dbURL, "voucher", "claim", "--campaign", "bf", "--member", "alice")
	require.Regexp(t, `(?m)^repeat\s+yes`, out)
	r := runDB(t, dbURL, "voucher", "claim", "--campaign", "bf", "--member", "bob")
	require.Equal(t, cli.ExitDenied, r.code, "sold out")
	require.Empty(t, r.stderr)
	require.Regexp(t, `(?m)^sold out\s+yes$`, r.stdout)

	file := filepath.Join(t.TempDir(), "codes.txt")
	require.NoError(t, os.WriteFile(file, []byte("AAA\n  BBB  \n\nAAA\n"), 0o600))
	out = ok(t, dbURL, "voucher", "import", "--campaign", "spring", "--file", file)
	require.Regexp(t, `(?m)^imported\s+2$`, out)
	require.Regexp(t, `(?m)^duplicates\s+1$`, out)
	out = ok(t, dbURL, "voucher", "claim", "--campaign", "spring", "--member", "alice")
	require.Regexp(t, `(?m)^code\s+(AAA|BBB)$`, out)
	ok(t, dbURL, "voucher", "claim", "--campaign", "spring", "--member", "bob")
	r = runDB(t, dbURL, "voucher", "claim", "--campaign", "spring", "--member", "carol")
	require.Equal(t, cli.ExitDenied, r.code)
	out = ok(t, dbURL, "voucher", "status", "--campaign", "spring")
	require.Regexp(t, `(?m)^kind\s+codes$`, out)
	require.Regexp(t, `(?m)^claimed\s+2$`, out)
	require.Regexp(t, `(?m)^sold out\s+yes$`, out)

	requireError(t, runDB(t, dbURL, "voucher", "create", "--campaign", "bf", "--total", "2"), cli.ExitUsage, "already exists")
	requireError(t, runDB(t, dbURL, "voucher", "status", "--campaign", "nope"), cli.ExitUsage, "not found")
	requireError(t, runDB(t, dbURL, "voucher", "claim", "--campaign", "nope", "--member", "m"), cli.ExitUsage, "not found")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	grant := []string{"grant", "--quota", "q", "--member", "m"}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }

	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown flag", with(grant, "--bogus"), []string{"unknown flag", "--bogus"}},
		{"unknown command", []string{"frobnicate"}, []string{"unknown command", "frobnicate"}},
		{"unknown subcommand", []string{"quota", "frobnicate"}, []string{"frobnicate"}},
		{"misspelt migrate subcommand", []string{"migrate", "upp"}, []string{"upp"}},
		{"group without subcommand", []string{"voucher"}, []string{"subcommand", "claim"}},
		{"extra argument", with(grant, "extra"), []string{"extra"}},
		{"missing required flag", []string{"grant", "--quota", "q"}, []string{"required flag", "member"}},
		{"missing required flags", []string{"voucher", "create"}, []string{"required flag", "campaign", "total"}},
		{"flag without value", []string{"grant", "--member", "m", "--quota"}, []string{"flag needs an argument", "quota"}},
		{"amount not a number", with(grant, "--amount", "abc"), []string{"amount", "abc"}},
		{"limit not a number", with(grant, "--limit", "1e3"), []string{"limit"}},
		{"duration not a duration", with(grant, "--limit", "1", "--connect-timeout", "soon"), []string{"connect-timeout"}},
		{"amount 0", with(grant, "--amount", "0", "--limit", "1"), []string{"amount"}},
		{"negative amount", with(grant, "--amount", "-3", "--limit", "1"), []string{"amount"}},
		{"negative limit", with(grant, "--limit", "-1"), []string{"limit"}},
		{"limit above MaxUnits", with(grant, "--limit", strconv.FormatInt(1<<62, 10)), []string{"limit"}},
		{"empty member", []string{"grant", "--quota", "q", "--member", "", "--limit", "1"}, []string{"member"}},
		{"member with a newline", []string{"grant", "--quota", "q", "--member", "a\nb", "--limit", "1"}, []string{"member", "control"}},
		{"member too long", []string{"grant", "--quota", "q", "--member", strings.Repeat("m", 256), "--limit", "1"}, []string{"member", "256"}},
		{"invalid UTF-8", []string{"grant", "--quota", "q", "--member", "\xff", "--limit", "1"}, []string{"member", "UTF-8"}},
		{"undefined quota", []string{"grant", "--quota", "nope", "--member", "m", "--limit", "1"}, []string{"quota not found", "nope", "pgquota quota define"}},
		{"undefined campaign", []string{"voucher", "claim", "--campaign", "nope", "--member", "m"}, []string{"campaign not found", "nope", "pgquota voucher create"}},
		{"undefined quota with a newline", []string{"usage", "--quota", "no\npe", "--member", "m"}, []string{"control"}},
		{"no limit anywhere", grant, []string{"no limit"}},
		{"unknown window", []string{"quota", "define", "--name", "x", "--window", "year"}, []string{"window", "year"}},
		{"unknown time zone", []string{"quota", "define", "--name", "x", "--window", "day", "--tz", "Mars/Olympus_Mons"}, []string{"time zone", "Mars/Olympus_Mons"}},
		{"negative default limit", []string{"quota", "define", "--name", "x", "--window", "day", "--limit", "-1"}, []string{"default limit"}},
		{"set-limit with both", []string{"quota", "set-limit", "--name", "q", "--member", "m", "--limit", "1", "--clear"}, []string{"--limit", "--clear"}},
		{"set-limit undefined quota", []string{"quota", "set-limit", "--name", "nope", "--member", "m", "--limit", "1"}, []string{"not found"}},
		{"revoke amount 0", []string{"revoke", "--quota", "q", "--member", "m", "--amount", "0"}, []string{"amount"}},
		{"voucher total 0", []string{"voucher", "create", "--campaign", "c", "--total", "0"}, []string{"total"}},
		{"voucher import missing file", []string{"voucher", "import", "--campaign", "c", "--file", "/nonexistent/codes.txt"}, []string{"--file", "/nonexistent/codes.txt"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireError(t, runDB(t, dbURL, tc.args...), cli.ExitUsage, tc.want...)
		})
	}
	// Nothing was written by any of them: only the two quotas exist, no
	// counter, no campaign.
	t.Cleanup(func() {
		out := ok(t, dbURL, "quota", "list", "--json")
		var qs []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &qs))
		require.Len(t, qs, 2)
	})
}

func TestMalformedURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://user:s3cret@localhost:notaport/db",
		"postgres://user:s3cret@[::1/db",
		"host=localhost password=s3cret port=notaport",
		"host=localhost password='s3cret",
		"mysql://user:s3cret@localhost/db",
	} {
		t.Run(u, func(t *testing.T) {
			t.Parallel()
			r := run(t, "--database-url", u, "grant", "--quota", "q", "--member", "m")
			requireError(t, r, cli.ExitUsage, "--database-url")
			require.NotContains(t, r.stderr, "s3cret", "the password is not printed")
		})
	}
}

// An unreachable server is an error (exit 1), reported within the connect
// timeout, whether it refuses connections or never answers.
func TestUnreachableServer(t *testing.T) {
	t.Parallel()

	// A server that accepts connections and then says nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})

	for name, addr := range map[string]string{
		"refused": "127.0.0.1:1",
		"silent":  ln.Addr().String(),
	} {
		for _, cmd := range [][]string{
			{"grant", "--quota", "q", "--member", "m", "--limit", "1"},
			{"migrate", "status"},
			{"quota", "list"},
		} {
			t.Run(name+" "+strings.Join(cmd[:2], " "), func(t *testing.T) {
				t.Parallel()
				args := append([]string{
					"--database-url", "postgres://postgres@" + addr + "/postgres?sslmode=disable",
					"--connect-timeout", "1s",
				}, cmd...)
				start := time.Now()
				r := run(t, args...)
				elapsed := time.Since(start)
				requireError(t, r, cli.ExitError, addr)
				require.Less(t, elapsed, 15*time.Second, "bounded by --connect-timeout")
				if name == "silent" {
					require.GreaterOrEqual(t, elapsed, 900*time.Millisecond, "it did wait for the server")
				}
			})
		}
	}
}

// jsonKeys collects every object key in a decoded JSON value.
func jsonKeys(v any, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			into[k] = true
			jsonKeys(e, into)
		}
	case []any:
		for _, e := range v {
			jsonKeys(e, into)
		}
	}
}

var snakeCase = regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)

// okJSON runs a command with --json, checks that its output is one JSON
// value with snake_case keys, and returns it decoded.
func okJSON(t *testing.T, dbURL string, code int, args ...string) any {
	t.Helper()
	r := runDB(t, dbURL, append([]string{"--json"}, args...)...)
	require.Equal(t, code, r.code, "stderr %q", r.stderr)
	require.Empty(t, r.stderr)
	var v any
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	require.NoError(t, dec.Decode(&v), "stdout %q", r.stdout)
	require.False(t, dec.More(), "one JSON value")
	keys := map[string]bool{}
	jsonKeys(v, keys)
	for k := range keys {
		require.Regexp(t, snakeCase, k, "pgquota %s", strings.Join(args, " "))
	}
	return v
}

func TestJSONOutput(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)

	g := okJSON(t, dbURL, cli.ExitOK, "grant", "--quota", "lim", "--member", "m").(map[string]any)
	for _, k := range []string{"granted", "quota", "member", "amount", "used", "limit", "remaining", "window_start", "window_end"} {
		require.Contains(t, g, k)
	}
	require.Equal(t, true, g["granted"])
	require.Equal(t, 1.0, g["used"])
	require.Equal(t, 2.0, g["limit"])
	require.Equal(t, 1.0, g["remaining"])
	start, err := time.Parse(time.RFC3339Nano, g["window_start"].(string))
	require.NoError(t, err)
	end, err := time.Parse(time.RFC3339Nano, g["window_end"].(string))
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, end.Sub(start))

	okJSON(t, dbURL, cli.ExitOK, "grant", "--quota", "lim", "--member", "m")
	g = okJSON(t, dbURL, cli.ExitDenied, "grant", "--quota", "lim", "--member", "m").(map[string]any)
	require.Equal(t, false, g["granted"])
	require.Equal(t, 2.0, g["used"])

	u := okJSON(t, dbURL, cli.ExitOK, "usage", "--quota", "lim", "--member", "m").(map[string]any)
	require.Equal(t, true, u["has_limit"])
	rv := okJSON(t, dbURL, cli.ExitOK, "revoke", "--quota", "lim", "--member", "m", "--amount", "1").(map[string]any)
	require.Equal(t, 1.0, rv["revoked"])

	q := okJSON(t, dbURL, cli.ExitOK, "quota", "define", "--name", "tz", "--window", "week", "--tz", "europe/berlin").(map[string]any)
	require.Equal(t, "Europe/Berlin", q["time_zone"])
	require.Contains(t, q, "default_limit")
	require.Nil(t, q["default_limit"])
	qs := okJSON(t, dbURL, cli.ExitOK, "quota", "list").([]any)
	require.Len(t, qs, 3)
	okJSON(t, dbURL, cli.ExitOK, "quota", "set-limit", "--name", "q", "--member", "m", "--limit", "3")
	okJSON(t, dbURL, cli.ExitOK, "quota", "set-limit", "--name", "q", "--member", "m", "--clear")

	p := okJSON(t, dbURL, cli.ExitOK, "voucher", "create", "--campaign", "bf", "--total", "1").(map[string]any)
	require.Equal(t, "counted", p["kind"])
	c := okJSON(t, dbURL, cli.ExitOK, "voucher", "claim", "--campaign", "bf", "--member", "m").(map[string]any)
	require.Equal(t, true, c["claimed"])
	require.Equal(t, 1.0, c["seq"])
	c = okJSON(t, dbURL, cli.ExitDenied, "voucher", "claim", "--campaign", "bf", "--member", "other").(map[string]any)
	require.Equal(t, false, c["claimed"])
	s := okJSON(t, dbURL, cli.ExitOK, "voucher", "status", "--campaign", "bf").(map[string]any)
	require.Equal(t, true, s["sold_out"])
	file := filepath.Join(t.TempDir(), "codes.txt")
	require.NoError(t, os.WriteFile(file, []byte("x\ny\n"), 0o600))
	imp := okJSON(t, dbURL, cli.ExitOK, "voucher", "import", "--campaign", "codes", "--file", file).(map[string]any)
	require.Equal(t, 2.0, imp["imported"])

	v := okJSON(t, dbURL, cli.ExitOK, "migrate", "version").(map[string]any)
	require.Equal(t, float64(migrations.Latest()), v["version"])
	require.Equal(t, float64(migrations.Latest()), v["latest"])
	st := okJSON(t, dbURL, cli.ExitOK, "migrate", "status").([]any)
	files, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	require.Len(t, st, len(files))
	okJSON(t, dbURL, cli.ExitOK, "migrate", "up")
}

// requireAligned checks aligned key/value output: on every line the value
// starts in the same column, after at least two spaces.
func requireAligned(t *testing.T, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Greater(t, len(lines), 1)
	col := -1
	for _, line := range lines {
		i := strings.Index(line, "  ")
		require.Positive(t, i, "line %q has a key and a value", line)
		j := i + len(line[i:]) - len(strings.TrimLeft(line[i:], " "))
		if col < 0 {
			col = j
		}
		require.Equal(t, col, j, "value column of %q in\n%s", line, out)
	}
}

func TestTextOutputAligned(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	requireAligned(t, ok(t, dbURL, "grant", "--quota", "lim", "--member", "a-rather-long-member-name"))
	requireAligned(t, ok(t, dbURL, "usage", "--quota", "lim", "--member", "m"))
	requireAligned(t, ok(t, dbURL, "voucher", "create", "--campaign", "bf", "--total", "3"))
	requireAligned(t, ok(t, dbURL, "migrate", "version"))

	// Tables: every cell of a column starts where its header does.
	ok(t, dbURL, "quota", "define", "--name", "a-quota-with-a-long-name", "--window", "hour", "--tz", "America/Argentina/Buenos_Aires", "--limit", "1000000")
	out := ok(t, dbURL, "quota", "list")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 4)
	header := lines[0]
	var cols []int
	for _, h := range []string{"NAME", "WINDOW", "TIME ZONE", "DEFAULT LIMIT"} {
		cols = append(cols, strings.Index(header, h))
	}
	require.Equal(t, 0, cols[0])
	for _, line := range lines[1:] {
		for _, c := range cols[1:] {
			require.Greater(t, len(line), c, "%q", line)
			require.Equal(t, byte(' '), line[c-1], "column at %d in %q", c, line)
			require.NotEqual(t, byte(' '), line[c], "column at %d in %q", c, line)
		}
	}
	require.Regexp(t, `(?m)^a-quota-with-a-long-name\s+hour\s+America/Argentina/Buenos_Aires\s+1000000$`, out)
	require.Regexp(t, `(?m)^q\s+day\s+UTC\s+-$`, out)
}

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)
	latest := strconv.FormatInt(migrations.Latest(), 10)
	files, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	prev, err := strconv.ParseInt(files[len(files)-2].Name()[:5], 10, 64)
	require.NoError(t, err)
	previous := strconv.FormatInt(prev, 10) // the version below the newest

	// Before: the schema is missing, and the message says what to do.
	for _, args := range [][]string{
		{"grant", "--quota", "q", "--member", "m", "--limit", "1"},
		{"quota", "list"},
		{"voucher", "status", "--campaign", "c"},
	} {
		requireError(t, runDB(t, dbURL, args...), cli.ExitError, "schema", "missing", "pgquota migrate up")
	}

	out := ok(t, dbURL, "migrate", "up")
	entries := files
	require.NoError(t, err)
	for _, e := range entries {
		require.Contains(t, out, e.Name())
	}
	require.Regexp(t, `(?m)^version\s+`+latest+` \(this build needs `+latest+`\)$`, out)
	out = ok(t, dbURL, "migrate", "up")
	require.Contains(t, out, "no migrations to apply")

	out = ok(t, dbURL, "migrate", "version")
	require.Regexp(t, `(?m)^version\s+`+latest+`$`, out)
	require.Regexp(t, `(?m)^latest\s+`+latest+`$`, out)
	out = ok(t, dbURL, "migrate", "status")
	require.NotContains(t, out, "pending")
	require.Regexp(t, `(?m)^VERSION\s+FILE\s+APPLIED$`, out)

	ok(t, dbURL, "quota", "define", "--name", "q", "--window", "day")
	ok(t, dbURL, "grant", "--quota", "q", "--member", "m", "--limit", "1")

	out = ok(t, dbURL, "migrate", "down")
	require.Regexp(t, `(?m)^version\s+`+previous+` \(this build needs `+latest+`\)$`, out)
	out = ok(t, dbURL, "migrate", "status")
	require.Equal(t, 1, strings.Count(out, "pending"), out)
	// Behind: commands refuse and name the fix.
	requireError(t, runDB(t, dbURL, "grant", "--quota", "q", "--member", "m", "--limit", "1"), cli.ExitError,
		"version "+previous, "pgquota migrate up")

	ok(t, dbURL, "migrate", "up")
	out = ok(t, dbURL, "migrate", "version")
	require.Regexp(t, `(?m)^version\s+`+latest+`$`, out)
	// Data of the migrations that stayed is still there.
	r := runDB(t, dbURL, "grant", "--quota", "q", "--member", "m", "--limit", "1")
	require.Equal(t, cli.ExitDenied, r.code, "stderr %q", r.stderr)

	// All the way down, then up again.
	for range migrations.Latest() {
		ok(t, dbURL, "migrate", "down")
	}
	out = ok(t, dbURL, "migrate", "version")
	require.Regexp(t, `(?m)^version\s+0$`, out)
	requireError(t, runDB(t, dbURL, "quota", "list"), cli.ExitError, "pgquota migrate up")
	ok(t, dbURL, "migrate", "up")
	ok(t, dbURL, "quota", "list")
}

// The connection comes from --database-url, else DATABASE_URL, else the
// libpq PG* variables. (No t.Parallel: t.Setenv.)
func TestDatabaseURLFromEnvironment(t *testing.T) {
	dbURL := migratedURL(t)

	t.Setenv("DATABASE_URL", dbURL)
	r := run(t, "grant", "--quota", "q", "--member", "env", "--limit", "1")
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)

	// --database-url wins over DATABASE_URL.
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/nowhere?sslmode=disable")
	r = run(t, "--database-url", dbURL, "grant", "--quota", "q", "--member", "flag", "--limit", "1")
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)

	// A malformed DATABASE_URL is a usage error that names it.
	t.Setenv("DATABASE_URL", "postgres://u:s3cret@localhost:notaport/db")
	r = run(t, "grant", "--quota", "q", "--member", "m", "--limit", "1")
	requireError(t, r, cli.ExitUsage, "DATABASE_URL", "postgres://user@host:5432/dbname")
	require.NotContains(t, r.stderr, "s3cret")

	// Without either, the libpq variables.
	t.Setenv("DATABASE_URL", "")
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	pass, _ := u.User.Password()
	t.Setenv("PGHOST", u.Hostname())
	t.Setenv("PGPORT", u.Port())
	t.Setenv("PGUSER", u.User.Username())
	t.Setenv("PGPASSWORD", pass)
	t.Setenv("PGDATABASE", strings.TrimPrefix(u.Path, "/"))
	t.Setenv("PGSSLMODE", "disable")
	r = run(t, "grant", "--quota", "q", "--member", "pg-env", "--limit", "1")
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	out := ok(t, dbURL, "usage", "--quota", "q", "--member", "pg-env")
	require.Regexp(t, `(?m)^used\s+1$`, out)
}

// The done-when scenario through Run: migrate up, define a quota,
// then twenty concurrent grants with limit 1 grant exactly once.
func TestConcurrentGrantRuns(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyURL(t)
	ok(t, dbURL, "migrate", "up")
	ok(t, dbURL, "quota", "define", "--name", "q", "--window", "day")

	const n = 20
	results := make([]result, n)
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			start.Wait()
			results[i] = runDB(t, dbURL, "grant", "--quota", "q", "--member", "m", "--limit", "1")
		}()
	}
	start.Done()
	done.Wait()
	codes := map[int]int{}
	for _, r := range results {
		codes[r.code]++
		require.Empty(t, r.stderr)
	}
	require.Equal(t, map[int]int{cli.ExitOK: 1, cli.ExitDenied: n - 1}, codes)
	out := ok(t, dbURL, "usage", "--quota", "q", "--member", "m")
	require.Regexp(t, `(?m)^used\s+1$`, out)
}

// The same with the real binary: twenty concurrent pgquota processes.
func TestConcurrentGrantProcesses(t *testing.T) {
	t.Parallel()
	// go test puts its own GOROOT/bin first on the PATH of the test binary.
	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "pgquota")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/pgquota/pgquota/cmd/pgquota")
	buildOut, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", buildOut)

	dbURL := pgtest.NewEmptyURL(t)
	pgquota := func(args ...string) (int, string, string) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			require.NoError(t, err)
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
	code, _, stderr := pgquota("migrate", "up")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = pgquota("quota", "define", "--name", "q", "--window", "day")
	require.Equal(t, 0, code, stderr)

	const n = 20
	codes := make([]int, n)
	stderrs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, stderrs[i] = pgquota("grant", "--quota", "q", "--member", "m", "--limit", "1")
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for i, c := range codes {
		count[c]++
		require.Empty(t, stderrs[i])
	}
	require.Equal(t, map[int]int{0: 1, 3: n - 1}, count)

	code, out, stderr := pgquota("--json", "usage", "--quota", "q", "--member", "m")
	require.Equal(t, 0, code, stderr)
	var u struct{ Used int64 }
	require.NoError(t, json.Unmarshal([]byte(out), &u))
	require.Equal(t, int64(1), u.Used)

	// Usage errors and exit statuses are the same from the binary.
	code, _, stderr = pgquota("grant", "--quota", "q")
	require.Equal(t, 2, code)
	require.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
	require.True(t, strings.HasPrefix(stderr, "pgquota: "), stderr)
}

// Small messages: each names what to fix.
func TestSmallMessages(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)

	// ledger show --key without --scope names --scope.
	requireError(t, runDB(t, dbURL, "ledger", "show", "--key", "k"), cli.ExitUsage, "--scope")
	requireError(t, runDB(t, dbURL, "ledger", "show", "--scope", "s"), cli.ExitUsage, "--key")

	// voucher import: a bad code is named by its line in the file, not by
	// its place among the codes (blank lines are skipped).
	file := filepath.Join(t.TempDir(), "codes.txt")
	require.NoError(t, os.WriteFile(file, []byte("AAA\n\n\nB\x01B\n"), 0o600))
	requireError(t, runDB(t, dbURL, "voucher", "import", "--campaign", "c", "--file", file), cli.ExitUsage,
		"--file "+file+" line 4: invalid code \"B\\x01B\"", "control characters")

	// quota limits lists per-member limits.
	out := ok(t, dbURL, "quota", "limits", "--name", "q")
	require.Contains(t, out, "no member of q has a limit of its own")
	ok(t, dbURL, "quota", "set-limit", "--name", "q", "--member", "vip", "--limit", "7")
	out = ok(t, dbURL, "quota", "limits", "--name", "q")
	require.Regexp(t, `(?m)^MEMBER\s+LIMIT\s+UPDATED$`, out)
	require.Regexp(t, `(?m)^vip\s+7\s+\S+$`, out)
	ms := okJSON(t, dbURL, cli.ExitOK, "quota", "limits", "--name", "q").([]any)
	require.Len(t, ms, 1)
	requireError(t, runDB(t, dbURL, "quota", "limits", "--name", "nope"), cli.ExitUsage, "quota not found")
}
