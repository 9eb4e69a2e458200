package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota/lease"
)

// cliArgsEnv carries the command line a child process started by
// startPgquota runs.
const cliArgsEnv = "PGQUOTA_TEST_CLI_ARGS"

// TestHelperProcessPgquota is the body of the child processes that
// startPgquota starts (this test binary, run again): it runs the pgquota
// command line in $PGQUOTA_TEST_CLI_ARGS and exits with its status. Run
// directly (the variable unset) it does nothing.
func TestHelperProcessPgquota(t *testing.T) {
	raw := os.Getenv(cliArgsEnv)
	if raw == "" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(cli.ExitError)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cli.Run(ctx, args, os.Stdout, os.Stderr))
}

// startPgquota runs the pgquota command line args in a child process of
// its own, whose stdout and stderr are returned, so the test can stop and
// continue it with real signals.
func startPgquota(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer, *syncBuffer) {
	t.Helper()
	raw, err := json.Marshal(args)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessPgquota$", "-test.count=1")
	cmd.Env = append(os.Environ(), cliArgsEnv+"="+string(raw))
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, stdout, stderr
}

// A leader whose process is stopped (SIGSTOP) past its TTL loses
// leadership: another campaigner takes over, the stopped leader's fenced
// write is rejected, and once continued (SIGCONT) it learns it lost and
// exits 3.
func TestCLIElectionStoppedLeaderIsDeposed(t *testing.T) {
	t.Parallel()
	requireStoppedLeaderIsDeposed(t, pgtest.NewURL(t))
}

// requireStoppedLeaderIsDeposed is TestCLIElectionStoppedLeaderIsDeposed on
// the migrated database dbURL (a plain server's, or a Citus
// coordinator's).
func requireStoppedLeaderIsDeposed(t *testing.T, dbURL string) {
	t.Helper()
	ctx := context.Background()

	leader, stdout, stderr := startPgquota(t, "--database-url", dbURL, "election", "campaign", "--name", "primary",
		"--ttl", "1s", "--value", "a:5432", "--json")
	var first struct {
		Token int64 `json:"token"`
	}
	require.Eventually(t, func() bool { return json.Unmarshal([]byte(stdout.String()), &first) == nil && first.Token > 0 },
		30*time.Second, 10*time.Millisecond, "the child did not become leader: %s", stderr.String())
	require.NoError(t, leader.Process.Signal(syscall.SIGSTOP))

	c := leaseClient(t, dbURL)
	e, err := c.NewElection("primary", lease.ElectionOptions{Holder: "b", TTL: 5 * time.Second})
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := e.Campaign(cctx, "b:5432")
	require.NoError(t, err, "b takes over once the stopped leader's lease expired")
	defer b.Resign(ctx)
	require.Greater(t, b.Token(), first.Token)

	r := runDB(t, dbURL, "fence", "write", "--resource", "primary", "--key", "config", "--value", "from a",
		"--token", fmt.Sprint(first.Token))
	requireError(t, r, cli.ExitDenied, fmt.Sprintf("stale fencing token %d", first.Token))
	ok(t, dbURL, "fence", "write", "--resource", "primary", "--key", "config", "--value", "from b", "--token", fmt.Sprint(b.Token()))

	require.NoError(t, leader.Process.Signal(syscall.SIGCONT))
	exited := make(chan error, 1)
	go func() { exited <- leader.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the continued leader did not notice it lost")
	}
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit: %v", err)
	require.Equal(t, cli.ExitDenied, ee.ExitCode(), stderr.String())
	require.Contains(t, stderr.String(), "leadership lost")

	cur, err := e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, b.Token(), cur.Token, "the deposed leader's exit left b's lease alone")
	require.True(t, strings.HasPrefix(cur.Payload, "b:"))
}
