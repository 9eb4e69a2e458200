package fence_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// psqlPath returns psql's path, failing the test when it is missing: the
// guard's promise is about writers that bypass pgquota, and psql is the
// one every deployment has.
func psqlPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("psql")
	require.NoError(t, err, "this test runs psql as the stale writer: install the PostgreSQL client (Debian: postgresql-client)")
	return p
}

// pausedWriter is a psql process whose script can be stopped half way.
type pausedWriter struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer
}

// startPsql starts psql on dbURL with ON_ERROR_STOP and verbose errors,
// and waits until it has connected.
func startPsql(t *testing.T, dbURL string) *pausedWriter {
	t.Helper()
	cmd := exec.Command(psqlPath(t), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-d", dbURL)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	w := &pausedWriter{cmd: cmd, stdin: stdin, lines: make(chan string, 16), stderr: &bytes.Buffer{}}
	cmd.Stderr = w.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	w.send(t, "SELECT 'connected';\n")
	w.expect(t, "connected")
	return w
}

func (w *pausedWriter) send(t *testing.T, script string) {
	t.Helper()
	_, err := io.WriteString(w.stdin, script)
	require.NoError(t, err)
}

func (w *pausedWriter) expect(t *testing.T, line string) {
	t.Helper()
	select {
	case got, ok := <-w.lines:
		require.True(t, ok, "psql ended before printing %q; stderr: %s", line, w.stderr)
		require.Equal(t, line, got)
	case <-time.After(10 * time.Second):
		t.Fatalf("psql printed no %q within 10s; stderr: %s", line, w.stderr)
	}
}

func (w *pausedWriter) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(sig))
}

// finish closes psql's input and returns its exit status.
func (w *pausedWriter) finish(t *testing.T) int {
	t.Helper()
	require.NoError(t, w.stdin.Close())
	err := w.cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// A real paused holder: holder A, a psql process, has checked that it holds
// the lease and issued its write, and is stopped (SIGSTOP) past the lease's
// TTL; B acquires and writes row 1; A is continued (SIGCONT) and its
// UPDATE (leaving the token column alone), DELETE or TRUNCATE runs, in a
// transaction that presents A's token, or presents none (each statement),
// or puts A's token into the guard's setting by hand (the UPDATE). Every
// round, A's statement is refused with the documented SQLSTATE and row 1 is
// B's. In the last rounds A is stopped inside its transaction, after
// presenting its token and before its UPDATE or DELETE: B's acquisition
// then waits for A's transaction, so A's write lands before B's token
// exists, and is no stale write.
func TestFenceGuardPausedHolderProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	dbURL := libpqURL(t, b.pool.Config().ConnString())
	g := b.guardReports(t, "reports", false)
	const ttl = 250 * time.Millisecond

	stmts := []string{
		`UPDATE reports SET val = 'stale' WHERE id = 1`,
		`DELETE FROM reports WHERE id = 1`,
		`TRUNCATE reports`,
	}
	kinds := []struct {
		name, prefix, code string
		stmts              []string
	}{
		{"presents its token", "SELECT pgquota.present_token('public.reports', %d);", fence.SQLStateStaleToken, stmts},
		{"presents none", "", fence.SQLStateTokenNotPresented, stmts},
		{"sets its token by hand", `SELECT set_config('pgquota.fence_tokens', '{"public.reports": %d}', true);`, fence.SQLStateTokenNotPresented, stmts[:1]},
	}
	rounds, refused := 0, 0
	for _, kind := range kinds {
		for _, stmt := range kind.stmts {
			rounds++
			w := startPsql(t, dbURL)
			a := b.acquire(t, g.Resource, "A", ttl)
			require.NoError(t, b.txWith(t, g.Resource, a.Token, fmt.Sprintf(`INSERT INTO reports VALUES (1, 'a', %d) ON CONFLICT (id) DO UPDATE SET val = 'a', tok = %d`, a.Token, a.Token)))
			l, err := b.leases.Get(b.ctx, g.Resource)
			require.NoError(t, err)
			require.True(t, l.Held && l.Token == a.Token, "A checked: it holds the lease")

			w.signal(t, syscall.SIGSTOP)
			script := "BEGIN;\n"
			if kind.prefix != "" {
				script += fmt.Sprintf(kind.prefix, a.Token) + "\n"
			}
			w.send(t, script+stmt+";\nCOMMIT;\n")
			time.Sleep(ttl + 100*time.Millisecond)
			bl := b.acquire(t, g.Resource, "B", time.Minute)
			require.Greater(t, bl.Token, a.Token)
			require.NoError(t, b.txWith(t, g.Resource, bl.Token, fmt.Sprintf(`UPDATE reports SET val = 'b', tok = %d WHERE id = 1`, bl.Token)))
			w.signal(t, syscall.SIGCONT)

			code := w.finish(t)
			require.Equal(t, 3, code, "A %s, %s: psql's exit status; stderr: %s", kind.name, stmt, w.stderr)
			require.Contains(t, w.stderr.String(), "ERROR:  "+kind.code+":", "A %s, %s", kind.name, stmt)
			require.Equal(t, fmt.Sprintf("1:b:%d", bl.Token), b.rowsOf(t, "reports"), "A %s, %s: no stale write landed", kind.name, stmt)
			refused++
			_, err = b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: bl.Token})
			require.NoError(t, err)
		}
	}

	// Stopped inside its transaction, after presenting its token.
	for _, stmt := range stmts[:2] {
		rounds++
		w := startPsql(t, dbURL)
		a := b.acquire(t, g.Resource, "A", ttl)
		require.NoError(t, b.txWith(t, g.Resource, a.Token, fmt.Sprintf(`INSERT INTO reports VALUES (1, 'a', %d) ON CONFLICT (id) DO UPDATE SET val = 'a', tok = %d`, a.Token, a.Token)))
		w.send(t, fmt.Sprintf("BEGIN;\nSELECT pgquota.present_token('public.reports', %d);\n", a.Token))
		w.expect(t, fmt.Sprint(a.Token))
		w.signal(t, syscall.SIGSTOP)
		w.send(t, strings.Replace(stmt, "'stale'", "'a-late'", 1)+";\nCOMMIT;\n")
		time.Sleep(ttl + 100*time.Millisecond)

		acquired := make(chan lease.Lease, 1)
		go func() {
			defer close(acquired)
			l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: g.Resource, Holder: "B", TTL: time.Minute})
			if err == nil {
				acquired <- l
			}
		}()
		select {
		case <-acquired:
			t.Fatalf("%s: B acquired while A's transaction, which presented its token, was open", stmt)
		case <-time.After(200 * time.Millisecond):
		}
		w.signal(t, syscall.SIGCONT)
		// A's lease expired while it was stopped: its statement is refused
		// (PQ002, psql exits 3), though no successor's token exists yet.
		require.Equal(t, 3, w.finish(t), "%s: A's write after its lease expired is refused", stmt)
		require.Contains(t, w.stderr.String(), "PQ002", stmt)
		refused++
		bl, ok := <-acquired
		require.True(t, ok, "B acquires once A's transaction ended")
		require.Greater(t, bl.Token, a.Token)
		require.Equal(t, fmt.Sprintf("1:a:%d", a.Token), b.rowsOf(t, "reports"), "%s: A's late statement changed nothing", stmt)
		err := b.txWith(t, g.Resource, a.Token, stmt)
		requireStale(t, err, g.Resource, a.Token, bl.Token)
		_, err = b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: bl.Token})
		require.NoError(t, err)
	}
	t.Logf("%d rounds with A stopped and continued; %d stale statements refused, 0 landed", rounds, refused)
}

// libpqURL returns dbURL without the settings only pgx knows (its exec
// mode, set when the pool goes through a transaction pooler), which psql
// refuses.
func libpqURL(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	return u.String()
}
