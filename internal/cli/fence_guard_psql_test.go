package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
)

// psql runs script through psql -v ON_ERROR_STOP=1 with verbose errors
// (which print the SQLSTATE) on dbURL, and returns its exit status, its
// output and its errors.
func psql(t *testing.T, dbURL, script string) (code int, stdout, stderr string) {
	t.Helper()
	p, err := exec.LookPath("psql")
	require.NoError(t, err, "this test runs psql: install the PostgreSQL client (Debian: postgresql-client)")
	cmd := exec.Command(p, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dbURL)
	cmd.Stdin = strings.NewReader("\\set VERBOSITY verbose\n" + script)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String(), errOut.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errOut.String()
}

// The guarded-table sequence, from the shell: the table guarded
// with `pgquota fence guard`, holder A acquires, B acquires after A's TTL
// and writes row 1, and A's UPDATE (leaving the token column alone), DELETE
// and TRUNCATE, run from psql, each exit 3 with the documented SQLSTATE:
// PQ003 when A presents no token, PQ001 when it presents its stale one.
func TestFenceGuardSequenceFromPsql(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	code, _, errOut := psql(t, dbURL, `CREATE TABLE public.reports (id int PRIMARY KEY, val text, tok bigint);`)
	require.Equal(t, 0, code, errOut)
	out := ok(t, dbURL, "fence", "guard", "--table", "public.reports", "--column", "tok")
	require.Regexp(t, `(?m)^resource\s+public\.reports$`, out)
	require.Contains(t, out, "SELECT pgquota.present_token('public.reports', <token>)")

	a := acquireJSON(t, dbURL, "--name", "public.reports", "--holder", "A", "--ttl", "300ms")
	time.Sleep(500 * time.Millisecond)
	b := acquireJSON(t, dbURL, "--name", "public.reports", "--holder", "B", "--ttl", "1m")
	require.Greater(t, b, a)
	code, _, errOut = psql(t, dbURL, fmt.Sprintf(`BEGIN;
SELECT pgquota.present_token('public.reports', %d);
INSERT INTO reports VALUES (1, 'b', %d);
COMMIT;
`, b, b))
	require.Equal(t, 0, code, errOut)

	for _, stmt := range []string{
		`UPDATE reports SET val = 'x' WHERE id = 1;`,
		`DELETE FROM reports WHERE id = 1;`,
		`TRUNCATE reports;`,
	} {
		code, _, errOut = psql(t, dbURL, stmt+"\n")
		require.Equal(t, 3, code, "%s without a token: %s", stmt, errOut)
		require.Contains(t, errOut, "ERROR:  PQ003: pgquota: no fencing token presented for resource public.reports", stmt)

		code, _, errOut = psql(t, dbURL, fmt.Sprintf("BEGIN;\nSELECT pgquota.present_token('public.reports', %d);\n%s\nCOMMIT;\n", a, stmt))
		require.Equal(t, 3, code, "%s with A's token: %s", stmt, errOut)
		require.Contains(t, errOut, fmt.Sprintf("ERROR:  PQ001: pgquota: stale fencing token %d for resource public.reports", a), stmt)

		// A's token put into the setting by hand: it carries no proof of
		// presentation, and the guard refuses the statement.
		code, _, errOut = psql(t, dbURL, fmt.Sprintf("BEGIN;\nSELECT set_config('pgquota.fence_tokens', '{\"public.reports\": %d}', true);\n%s\nCOMMIT;\n", a, stmt))
		require.Equal(t, 3, code, "%s with A's token set by hand: %s", stmt, errOut)
		require.Contains(t, errOut, fmt.Sprintf("ERROR:  PQ003: pgquota: fencing token %d for resource public.reports was not presented with pgquota.present_token in this transaction: %s on public.reports refused",
			a, strings.Fields(stmt)[0]), stmt)
	}
	code, rows, errOut := psql(t, dbURL, "SELECT id, val, tok FROM reports;\n")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("1|b|%d\n", b), rows, "B's row is intact")
}
