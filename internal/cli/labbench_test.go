package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/bench"
	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/lab"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// run calls the CLI with buffers, against the test server.
// runOut runs the CLI against the test server (the lab and the bench make
// their own scratch databases) and returns its stdout, stderr and exit code.
func runOut(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	pgtest.ReserveAtLeast(t, labBenchConns(args), "pgquota "+args[0]+"'s connections")
	r := runDB(t, pgtest.BaseURL(t), args...)
	return r.stdout, r.stderr, r.code
}

// labBenchConns is how many connections `pgquota lab` or `pgquota bench`
// with args opens at most: the CLI's pool (4), and the lab's requests
// (--requests, default 20) with its pool of 2, or the bench's largest
// --clients (default 64) with its capture and setup connections.
func labBenchConns(args []string) int {
	flag := func(name, def string) string {
		for i, a := range args {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
		return def
	}
	switch args[0] {
	case "lab":
		n, _ := strconv.Atoi(flag("--requests", "20"))
		return 4 + 2 + max(n, 0)
	case "bench":
		most := 0
		for _, c := range strings.Split(flag("--clients", "64"), ",") {
			n, _ := strconv.Atoi(c)
			most = max(most, n)
		}
		return 4 + 2 + most
	}
	return 4
}

func TestLabJSON(t *testing.T) {
	t.Parallel()
	out, errs, code := runOut(t, "lab", "--json", "--requests", "6", "--limit", "2", "--runs", "2",
		"--strategy", "no-lock,conditional,redis-lock,fenced", "--redis-url", "redis://127.0.0.1:1")
	require.Equal(t, cli.ExitOK, code, errs)
	require.Empty(t, errs)
	var rep lab.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, 6, rep.Requests)
	require.Equal(t, int64(2), rep.Limit)
	require.Empty(t, rep.Violations)
	got := map[string]lab.StrategyReport{}
	for _, s := range rep.Strategies {
		got[s.Name] = s
	}
	require.Len(t, got, 4)
	require.Equal(t, 2, got["conditional"].ExactRuns)
	require.Equal(t, 2, got["no-lock"].LeakedRuns)
	require.Equal(t, lab.StatusUnavailable, got["redis-lock"].Status)
	require.Equal(t, 2, got["fenced"].ExactRuns)
	for _, r := range got["fenced"].Runs {
		require.Equal(t, int64(2), r.Granted)
		require.Zero(t, r.Leaked)
		require.Positive(t, r.StaleRejected, "holders paused past the TTL are fenced off")
	}
}

func TestLabText(t *testing.T) {
	t.Parallel()
	out, errs, code := runOut(t, "lab", "--requests", "5", "--strategy", "no-lock,conditional,fenced")
	require.Equal(t, cli.ExitOK, code, errs)
	require.Contains(t, out, "5 concurrent requests")
	require.Contains(t, out, "injected:")
	require.Contains(t, out, "think 50ms")
	require.Regexp(t, regexp.MustCompile(`(?m)^strategy\s+granted\s+leaked\s+stale rejected\s+two holders\s+counter\s+wall ms\s+result\s+article$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^conditional\s+1\s+0\s+0\s+-\s+1\s+\d+\s+exact\s+granted 1 of 20$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^no-lock\s+\d+\s+[1-9]\d*\s+0\s+-\s+1\s+\d+\s+LEAKED \(what not to do\)\s+leaked 16 of 20$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^fenced\s+1\s+0\s+[1-9]\d*\s+-\s+1\s+\d+\s+exact\s+-$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^article: .*over HTTP/2`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^  fenced\s+pgquota lease, TTL 100ms: .*pause 200ms \(> TTL`), out)
	require.NotContains(t, out, "pending")
	require.Contains(t, out, "dropped afterwards), synchronous_commit=off")
}

func TestLabUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"lab", "--runs", "0"},
		{"lab", "--requests", "-1"},
		{"lab", "--strategy", "nope"},
		{"lab", "--think", "soon"},
	} {
		// A usage error: the command connects to nothing.
		r := runDB(t, pgtest.BaseURL(t), args...)
		errs, code := r.stderr, r.code
		require.Equal(t, cli.ExitUsage, code, "%v: %s", args, errs)
		require.Equal(t, 1, strings.Count(errs, "\n"), errs)
	}
}

func TestBenchJSONWithPgbenchAndSVG(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pgbench"); err != nil {
		t.Skipf("pgbench is not installed: %v", err)
	}
	chart := filepath.Join(t.TempDir(), "bench.svg")
	out, errs, code := runOut(t, "bench", "--json", "--strategy", "grant-hot", "--clients", "2",
		"--duration", "1s", "--pgbench", "--chart", chart)
	require.Equal(t, cli.ExitOK, code, errs)
	require.Empty(t, errs, "no progress bar with --json")
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.Equal(t, "grant-hot", r.Strategy)
	require.Equal(t, 2, r.Clients)
	require.Equal(t, int32(2), r.Library.Connections)
	require.Positive(t, r.Library.Ops)
	require.Zero(t, r.Library.Errors)
	require.NotNil(t, r.Pgbench)
	require.Contains(t, r.Pgbench.Command, "--protocol=prepared")
	require.Contains(t, r.Pgbench.Command, "--client=2")
	require.Contains(t, r.Pgbench.Command, "--time=1")
	require.Equal(t, "on", rep.Server.SynchronousCommit)
	require.Len(t, rep.Scripts, 1)
	require.Contains(t, rep.Scripts[0].Text, "FROM pgquota.grant_row(:c1::text, :c2::text, :c3::bigint, :c4::bigint)", "the grant statement the library sent")
	if r.Pgbench.TPS > 0 {
		require.InDelta(t, r.Library.OpsPerSec/r.Pgbench.TPS, r.Ratio, 1e-9)
	}
	requireSVG(t, chart)
}

func TestBenchTextAndPNG(t *testing.T) {
	t.Parallel()
	chart := filepath.Join(t.TempDir(), "bench.png")
	out, errs, code := runOut(t, "bench", "--strategy", "grant-spread,voucher-claim", "--clients", "1,2",
		"--duration", "200ms", "--rounds", "2", "--chart", chart)
	require.Equal(t, cli.ExitOK, code, errs)
	require.Empty(t, errs, "no progress bar when stderr is not a terminal")
	require.Regexp(t, regexp.MustCompile(`(?m)^strategy\s+clients\s+ops/s\s+p50 ms\s+p95 ms\s+p99 ms\s+retries\s+errors$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^grant-spread\s+1\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+0\s+0$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^voucher-claim\s+2\s+\d+`), out)
	require.NotContains(t, out, "pending")
	require.NotContains(t, out, "ratio ", "no ratio lines without --pgbench")
	require.Contains(t, out, "2 rounds per run")
	require.Regexp(t, regexp.MustCompile(`(?m)^  voucher-claim/2: \d+ \d+$`), out)

	f, err := os.Open(chart)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Greater(t, img.Bounds().Dx(), 100)
}

// TestBenchFencedLockWithPgbench: the fenced lock's two statements run
// through the library and pgbench without errors, and the text ends with
// their ratio lines.
func TestBenchFencedLockWithPgbench(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pgbench"); err != nil {
		t.Skipf("pgbench is not installed: %v", err)
	}
	out, errs, code := runOut(t, "bench", "--strategy", "lease-acquire,fenced-write", "--clients", "2",
		"--duration", "1s", "--pgbench")
	require.Equal(t, cli.ExitOK, code, errs)
	require.Empty(t, errs)
	for _, name := range []string{"lease-acquire", "fenced-write"} {
		// strategy, clients, ops/s, p50, p95, p99, retries 0, errors 0, pgbench/s, pgb p50..p99, ratio
		require.Regexp(t, regexp.MustCompile(`(?m)^`+name+`\s+2\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+0\s+0\s+\d+(\s+[0-9.]+){3}\s+[0-9.]+$`), out)
		require.Regexp(t, regexp.MustCompile(`(?m)^ratio `+name+`/2 [0-9]+\.[0-9]{2}$`), out)
	}
	require.NotContains(t, out, "first error")
	require.NotContains(t, out, "rounds")
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--strategy", "nope"},
		{"bench", "--chart", "x.pdf"},
		{"bench", "--clients", "0"},
		{"bench", "--duration", "0s"},
		{"bench", "--pgbench", "--duration", "1500ms"},
		{"bench", "--rounds", "0"},
	} {
		// A usage error: the command connects to nothing.
		r := runDB(t, pgtest.BaseURL(t), args...)
		errs, code := r.stderr, r.code
		require.Equal(t, cli.ExitUsage, code, "%v: %s", args, errs)
		require.Equal(t, 1, strings.Count(errs, "\n"), errs)
	}
}

// requireSVG checks that path holds a well-formed SVG document.
func requireSVG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	var root string
	for {
		tok, err := dec.Token()
		if err != nil {
			require.ErrorContains(t, err, "EOF")
			break
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	require.Equal(t, "svg", root)
	require.Contains(t, string(b), "grant-hot")
}

// lab --keep says how to connect to the kept database and how to drop it,
// and those commands' URLs work.
func TestLabKeep(t *testing.T) {
	t.Parallel()
	out, errs, code := runOut(t, "lab", "--keep", "--requests", "3", "--strategy", "conditional")
	require.Equal(t, cli.ExitOK, code, errs)
	m := regexp.MustCompile(`(?m)^kept scratch database (\S+) \(--keep\):\n  connect: psql '([^']+)'\n  drop:    psql '([^']+)' -c 'DROP DATABASE (\S+)'$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.Equal(t, m[1], m[4])
	require.NotContains(t, out, "password")
	// The printed URLs leave the password out; the test adds the base
	// URL's back.
	withPassword := func(s string) string {
		base, err := url.Parse(pgtest.BaseURL(t))
		require.NoError(t, err)
		u, err := url.Parse(s)
		require.NoError(t, err)
		if p, ok := base.User.Password(); ok {
			require.NotContains(t, out, p)
			u.User = url.UserPassword(u.User.Username(), p)
		}
		return u.String()
	}
	admin := pgtest.Connect(t, withPassword(m[3]), 1)
	kept := pgtest.Connect(t, withPassword(m[2]), 1)
	var name string
	require.NoError(t, kept.QueryRow(context.Background(), `SELECT current_database()`).Scan(&name))
	require.Equal(t, m[1], name)
	kept.Close()
	_, err := admin.Exec(context.Background(), `DROP DATABASE `+m[4]+` WITH (FORCE)`)
	require.NoError(t, err)
}
