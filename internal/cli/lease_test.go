package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// run runs the pgquota command line against dbURL and returns its exit
// status, stdout and stderr.
// runLease runs the CLI against dbURL and returns its exit code, stdout and
// stderr.
func runLease(t *testing.T, dbURL string, args ...string) (int, string, string) {
	t.Helper()
	r := runDB(t, dbURL, args...)
	return r.code, r.stdout, r.stderr
}

// acquireJSON acquires a lease through the CLI and returns its token.
func acquireJSON(t *testing.T, dbURL string, args ...string) int64 {
	t.Helper()
	code, out, errOut := runLease(t, dbURL, append([]string{"lease", "acquire", "--json"}, args...)...)
	require.Equal(t, cli.ExitOK, code, errOut)
	var l struct {
		Token    int64 `json:"token"`
		Acquired bool  `json:"acquired"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &l), out)
	require.True(t, l.Acquired)
	return l.Token
}

// The "done when" scenario, from the shell's point of view.
func TestCLILeaseFenceDoneWhen(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)

	t1 := acquireJSON(t, dbURL, "--name", "report", "--ttl", "1s", "--holder", "host-a")
	time.Sleep(2 * time.Second)
	t2 := acquireJSON(t, dbURL, "--name", "report", "--holder", "host-b")
	require.Greater(t, t2, t1)

	code, out, errOut := runLease(t, dbURL, "fence", "write", "--resource", "report", "--key", "status", "--token", fmt.Sprint(t2), "--value", "done")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, "written")

	for _, key := range []string{"status", "new-key"} {
		code, out, errOut = runLease(t, dbURL, "fence", "write", "--resource", "report", "--key", key, "--token", fmt.Sprint(t1), "--value", "stale")
		require.Equal(t, cli.ExitDenied, code, "key %s: %s%s", key, out, errOut)
		require.Contains(t, errOut, fmt.Sprintf("stale fencing token %d", t1), "the message names the stale token")
		require.Contains(t, errOut, fmt.Sprintf("highest token seen is %d", t2))
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr")
	}

	code, out, _ = runLease(t, dbURL, "fence", "show", "--resource", "report", "--json")
	require.Equal(t, cli.ExitOK, code)
	var shown struct {
		Highest int64 `json:"highest_token"`
		Rows    []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
			Token int64  `json:"token"`
		} `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, t2, shown.Highest)
	require.Len(t, shown.Rows, 1)
	require.Equal(t, "done", shown.Rows[0].Value)
}

func TestCLILease(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	tok := acquireJSON(t, dbURL, "--name", "job", "--ttl", "30s", "--holder", "a")

	// Held: exit 3, naming the holder.
	code, out, errOut := runLease(t, dbURL, "lease", "acquire", "--name", "job", "--holder", "b")
	require.Equal(t, cli.ExitDenied, code)
	require.Contains(t, errOut, `held by "a"`)
	require.Contains(t, out, "acquired")

	code, out, errOut = runLease(t, dbURL, "lease", "renew", "--name", "job", "--token", fmt.Sprint(tok), "--ttl", "1m")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprint(tok))

	code, out, _ = runLease(t, dbURL, "lease", "show", "--name", "job", "--json")
	require.Equal(t, cli.ExitOK, code)
	var l struct {
		Holder string `json:"holder"`
		Held   bool   `json:"held"`
		Token  int64  `json:"token"`
		Left   int64  `json:"remaining_ms"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &l))
	require.Equal(t, "a", l.Holder)
	require.True(t, l.Held)
	require.Greater(t, l.Left, int64(50000))

	// A wrong token: exit 3, the lease untouched.
	code, _, errOut = runLease(t, dbURL, "lease", "release", "--name", "job", "--token", fmt.Sprint(tok+100))
	require.Equal(t, cli.ExitDenied, code)
	require.Contains(t, errOut, "lease lost")
	code, _, errOut = runLease(t, dbURL, "lease", "release", "--name", "job", "--token", fmt.Sprint(tok))
	require.Equal(t, cli.ExitOK, code, errOut)
	code, out, _ = runLease(t, dbURL, "lease", "show", "--name", "job")
	require.Equal(t, cli.ExitOK, code)
	require.Regexp(t, `held\s+no`, out)

	// Usage errors.
	code, _, errOut = runLease(t, dbURL, "lease", "acquire", "--name", "job", "--ttl", "0s")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "ttl")
	code, _, _ = runLease(t, dbURL, "lease", "renew", "--name", "job")
	require.Equal(t, cli.ExitUsage, code)
	code, _, _ = runLease(t, dbURL, "lease", "show", "--name", "nope")
	require.Equal(t, cli.ExitUsage, code)
}

func TestCLIFenceExternalAndGuard(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	code, _, errOut := runLease(t, dbURL, "fence", "write", "--resource", "zk", "--key", "k", "--token", "7719", "--value", "v", "--external")
	require.Equal(t, cli.ExitOK, code, errOut)
	// Without --external the token must belong to a held lease.
	code, _, errOut = runLease(t, dbURL, "fence", "write", "--resource", "zk", "--key", "k", "--token", "7720", "--value", "v")
	require.Equal(t, cli.ExitDenied, code)
	require.Contains(t, errOut, "lease lost")
	code, _, _ = runLease(t, dbURL, "fence", "write", "--resource", "zk", "--key", "k", "--token", "7720", "--external", "--lease", "x")
	require.Equal(t, cli.ExitUsage, code)

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), `CREATE TABLE orders (id int PRIMARY KEY, fence_token bigint)`)
	require.NoError(t, err)
	code, out, errOut := runLease(t, dbURL, "fence", "guard", "--table", "orders", "--column", "fence_token")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, "PQ001")
	require.Contains(t, out, "PQ003")
	require.Regexp(t, `(?m)^upgraded\s+no$`, out)
	_, err = pool.Exec(context.Background(), `INSERT INTO orders VALUES (1, 10)`)
	require.ErrorContains(t, err, "PQ003")
	code, out, errOut = runLease(t, dbURL, "fence", "guard", "--table", "orders", "--column", "fence_token", "--external", "--json")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, `"external": true`)
	_, err = pool.Exec(context.Background(), `BEGIN; SELECT pgquota.present_token('public.orders', 10); INSERT INTO orders VALUES (1, NULL); COMMIT`)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `BEGIN; SELECT pgquota.present_token('public.orders', 9); UPDATE orders SET fence_token = 9; COMMIT`)
	require.ErrorContains(t, err, "PQ001")
	code, _, errOut = runLease(t, dbURL, "fence", "guard", "--table", "orders", "--column", "nope")
	require.Equal(t, cli.ExitUsage, code, errOut)
}

// After a release, renewing with the old token says the lease was released
// or expired (the row keeps the release time as its expiry); acquire's
// --help describes the default holder instead of showing the help's own
// pid.
func TestCLILeaseReleasedMessage(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	tok := fmt.Sprint(acquireJSON(t, dbURL, "--name", "job", "--ttl", "1m"))
	out := ok(t, dbURL, "lease", "show", "--name", "job")
	require.Regexp(t, `(?m)^holder\s+\S+:\d+$`, out, "the default holder is hostname:pid")
	ok(t, dbURL, "lease", "release", "--name", "job", "--token", tok)
	r := runDB(t, dbURL, "lease", "renew", "--name", "job", "--token", tok)
	requireError(t, r, cli.ExitDenied, `cannot renew lease "job" with token `+tok+": it was released or expired at ")

	help := run(t, "lease", "acquire", "--help")
	require.Equal(t, cli.ExitOK, help.code)
	require.Contains(t, help.stdout, "(default: hostname:pid of the running command)")
	require.NotRegexp(t, `default "[^"]*:\d+"`, help.stdout)
}
