package cli_test

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
)

// The text output of the Redlock strategies: redlock grants one more than
// the limit with two holders at once, redlock-fenced exactly the limit with
// the first holder's write rejected, and each run says which failure was
// injected and how (the pids of the killed and restarted instance).
func TestLabTextRedlockSaysWhichFailureWasInjected(t *testing.T) {
	t.Parallel()
	out, errs, code := runOut(t, "lab", "--requests", "4", "--strategy", "redlock,redlock-fenced")
	require.Equal(t, cli.ExitOK, code, errs)
	require.Regexp(t, regexp.MustCompile(`(?m)^redlock\s+2\s+1\s+0\s+[1-9]\d*\s+1\s+\d+\s+LEAKED \(what not to do\)\s+-$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^redlock-fenced\s+1\s+0\s+1\s+[1-9]\d*\s+1\s+\d+\s+exact\s+-$`), out)
	for _, name := range []string{"redlock", "redlock-fenced"} {
		require.Regexp(t, regexp.MustCompile(`(?m)^`+name+` run 1, fault: request 1 got the lock on instances 1-3 .*`+
			`instance 3 \(port \d+\) was killed by pid \d+ \(SIGKILL\) and started again on its port as pid \d+ without persistence`), out)
	}
	require.Contains(t, out, "instance 3 is killed by pid (SIGKILL)")
}

// A redis-server that cannot be found: the strategies are unavailable,
// the row says why, and the lab still exits 0 for the strategies that ran.
func TestLabTextRedisServerMissing(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "redis-server")
	out, errs, code := runOut(t, "lab", "--requests", "2", "--pause", "0", "--strategy", "redis-naive,redlock,conditional",
		"--redis-server", missing)
	require.Equal(t, cli.ExitOK, code, errs)
	require.Regexp(t, regexp.MustCompile(`(?m)^redis-naive\s+-\s+-\s+-\s+-\s+-\s+-\s+unavailable: redis-server ".*" not found`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^redlock\s+-\s+-\s+-\s+-\s+-\s+-\s+unavailable: instance 1 of 5: redis-server ".*" not found`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^conditional\s+1\s+0\s+0\s+-\s+1\s+\d+\s+exact`), out)
}
