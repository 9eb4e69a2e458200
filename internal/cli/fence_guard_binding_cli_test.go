package cli_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// fence guard binds the table to the lease named like its resource (or
// --lease, --semaphore): fence write --lease x on its resource is refused
// with exit 3 (SQLSTATE PQ004) and moves no mark; fence guards and fence
// show report whether the guard fires.
func TestFenceWriteAnotherLeaseOnGuardedResourceRefused(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	code, _, errOut := psql(t, dbURL, `CREATE TABLE public.t (id int PRIMARY KEY, val text, tok bigint);`)
	require.Equal(t, 0, code, errOut)
	out := ok(t, dbURL, "fence", "guard", "--table", "public.t", "--column", "tok")
	require.Regexp(t, `(?m)^tokens\s+pgquota lease "public.t" only`, out)
	a := acquireJSON(t, dbURL, "--name", "public.t", "--holder", "A", "--ttl", "1m")
	x := acquireJSON(t, dbURL, "--name", "x", "--holder", "X", "--ttl", "1m")
	require.Greater(t, x, a)

	r := runDB(t, dbURL, "fence", "write", "--resource", "public.t", "--lease", "x", "--key", "k", "--token", fmt.Sprint(x), "--value", "v")
	requireError(t, r, cli.ExitDenied, "resource public.t is bound to lease public.t", "PQ004")
	out = ok(t, dbURL, "fence", "show", "--resource", "public.t")
	require.Regexp(t, fmt.Sprintf(`(?m)^highest token\s+%d$`, a), out)
	require.Regexp(t, `(?m)^guarded table\s+public\.t yes$`, out)
	ok(t, dbURL, "fence", "write", "--resource", "public.t", "--key", "k", "--token", fmt.Sprint(a), "--value", "v")

	code, _, errOut = psql(t, dbURL, `ALTER TABLE public.t DISABLE TRIGGER pgquota_fence_guard;`)
	require.Equal(t, 0, code, errOut)
	r = runDB(t, dbURL, "fence", "guards")
	require.Equal(t, cli.ExitDenied, r.code, r.stderr)
	require.Contains(t, r.stdout, "NO: trigger pgquota_fence_guard is disabled")
	out = ok(t, dbURL, "fence", "show", "--resource", "public.t")
	require.Contains(t, out, "public.t NO: trigger pgquota_fence_guard is disabled")
}
