package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgbouncer"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// `pgquota lease acquire --wait` behind a real PgBouncer in transaction
// mode used to LISTEN through it and leave the LISTEN on a pooled server
// connection after the command had exited. With --pooler transaction the
// command waits by polling, in pgx's exec mode (set by the command itself:
// the URL names no mode), and leaves no server connection listening.
func TestCLIPoolerTransactionLeaseWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pgbouncer.Start(t, pgtest.BaseURL(t), pgbouncer.Options{})
	dbURL := pgtest.NewURL(t)
	pooled, err := b.URL(dbURL)
	require.NoError(t, err)

	first := acquireJSON(t, dbURL, "--name", "r", "--ttl", "1m", "--holder", "first")
	done := make(chan result, 1)
	go func() {
		done <- run(t, "--database-url", pooled, "--pooler", "transaction",
			"lease", "acquire", "--name", "r", "--ttl", "1m", "--holder", "second", "--wait", "--json")
	}()
	time.Sleep(300 * time.Millisecond)
	ok(t, dbURL, "lease", "release", "--name", "r", "--token", fmt.Sprint(first))
	r := <-done
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var l struct {
		Token  int64  `json:"token"`
		Holder string `json:"holder"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &l), r.stdout)
	require.Equal(t, "second", l.Holder)
	require.Greater(t, l.Token, first)

	chs, err := b.ServerChannels(ctx, pooled)
	require.NoError(t, err)
	require.Empty(t, chs, "server connections still LISTENing after the command exited")
	require.NotContains(t, b.Log(), "got packet 'A'")
}

// --pooler and $PGQUOTA_POOLER refuse a connection string that asks for a
// pgx exec mode unsafe behind a transaction pooler, and an unknown value;
// the flag wins over the variable.
func TestCLIPoolerSetting(t *testing.T) {
	dbURL := pgtest.NewURL(t)
	describe := dbURL + "&default_query_exec_mode=describe_exec"

	r := runDB(t, describe, "--pooler", "transaction", "lease", "show", "--name", "x")
	requireError(t, r, cli.ExitUsage, "--pooler=transaction", "DefaultQueryExecMode", "describe_exec", "default_query_exec_mode=exec")

	t.Setenv("PGQUOTA_POOLER", "transaction")
	r = runDB(t, describe, "lease", "show", "--name", "x")
	requireError(t, r, cli.ExitUsage, "$PGQUOTA_POOLER=transaction", "describe_exec")
	r = runDB(t, describe, "--pooler", "none", "lease", "show", "--name", "x")
	require.Equal(t, cli.ExitUsage, r.code, "lease x does not exist: %s", r.stderr)
	require.Contains(t, r.stderr, "not found")
	r = runDB(t, dbURL+"&default_query_exec_mode=simple_protocol", "lease", "show", "--name", "x")
	require.Contains(t, r.stderr, "not found", "simple_protocol is safe behind the pooler")

	t.Setenv("PGQUOTA_POOLER", "statement")
	r = runDB(t, dbURL, "lease", "show", "--name", "x")
	requireError(t, r, cli.ExitUsage, "$PGQUOTA_POOLER", "statement pooling")
	r = runDB(t, dbURL, "--pooler", "tx", "lease", "show", "--name", "x")
	requireError(t, r, cli.ExitUsage, "--pooler", "none or transaction")
}
