//go:build citus

package cli_test

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgbouncer"
	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// On a Citus coordinator, an application role that may not run DDL
// (granted pgquota's app role with `migrate grant-app`), through PgBouncer
// in transaction mode, gets the guarantees of one server: 20 concurrent
// grants from two Clients at a limit of 5 give 5, a keyed grant replays,
// a stale token is refused, from the shell too; the role writes a guarded
// table with the current holder's token and is refused with the previous
// one's; and the role can neither
// write pgquota's tables with plain SQL nor create a table.
func TestCitusAppRoleThroughPgBouncerTransactionModeIsExact(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	c.Exec(`CREATE ROLE app LOGIN`) // Citus creates it on the workers too
	ok(t, c.URL(), "migrate", "grant-app", "--role", "app")
	ok(t, c.URL(), "quota", "define", "--name", "q", "--window", "day", "--limit", "5")
	ctx := t.Context()
	b := pgbouncer.Start(t, c.URL(), pgbouncer.Options{PoolSize: 4})
	appURL, err := b.URL(c.URL("app"))
	require.NoError(t, err)

	newClient := func() *quota.Client {
		// pgx's exec mode: no named statements a transaction pooler
		// would run on another server connection.
		qc, err := quota.New(pgcluster.Pool(t, appURL+"&default_query_exec_mode=exec"), &quota.Config{Pooler: quota.PoolerTransaction})
		require.NoError(t, err)
		return qc
	}
	clients := []*quota.Client{newClient(), newClient()}
	require.NoError(t, clients[0].CheckSchema(ctx))
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := clients[i%2].Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
			}
			if res.Granted {
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 5, granted.Load())
	u, err := clients[1].Usage(ctx, "q", "m")
	require.NoError(t, err)
	require.EqualValues(t, 5, u.Used)

	keyed := quota.GrantRequest{Quota: "q", Member: "k", Amount: 2, Idempotency: quota.IdempotencyKey{Key: "order-1"}}
	first, err := clients[0].Grant(ctx, keyed)
	require.NoError(t, err)
	again, err := clients[1].Grant(ctx, keyed)
	require.NoError(t, err)
	require.True(t, first.Granted)
	require.True(t, again.Keyed.Replayed)
	u, err = clients[0].Usage(ctx, "q", "k")
	require.NoError(t, err)
	require.EqualValues(t, 2, u.Used, "the replay granted nothing again")

	lc, err := lease.New(clients[0])
	require.NoError(t, err)
	fc, err := fence.New(clients[1])
	require.NoError(t, err)
	old, err := lc.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "one", TTL: time.Minute})
	require.NoError(t, err)
	_, err = lc.Release(ctx, old)
	require.NoError(t, err)
	cur, err := lc.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "two", TTL: time.Minute})
	require.NoError(t, err)
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "new", Token: cur.Token, Lease: "job"})
	require.NoError(t, err)
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "old", Token: old.Token})
	require.ErrorIs(t, err, fence.ErrStaleToken)

	// A guarded table on the coordinator, written by the app role: the
	// current holder's write lands, the previous holder's is refused.
	c.Exec(`CREATE TABLE public.reports (id int PRIMARY KEY, status text, fence_token bigint);
		GRANT SELECT, INSERT, UPDATE ON public.reports TO app`)
	owner, err := quota.New(c.Pool(), nil)
	require.NoError(t, err)
	ofc, err := fence.New(owner)
	require.NoError(t, err)
	g, err := ofc.GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
	require.NoError(t, err)
	prev, err := lc.Acquire(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "one", TTL: time.Minute})
	require.NoError(t, err)
	_, err = lc.Release(ctx, prev)
	require.NoError(t, err)
	holder, err := lc.Acquire(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "two", TTL: time.Minute})
	require.NoError(t, err)
	report := func(token int64, status string) error {
		return fc.RunTx(ctx, fence.TxRequest{Resource: g.Resource, Token: token}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO public.reports (id, status) VALUES (1, $1)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status`, status)
			return err
		})
	}
	require.NoError(t, report(holder.Token, "current"), "the app role writes the guarded table with the current token")
	require.ErrorIs(t, report(prev.Token, "stale"), fence.ErrStaleToken)
	var status string
	var stamped int64
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT status, fence_token FROM public.reports WHERE id = 1`).Scan(&status, &stamped))
	require.Equal(t, "current", status)
	require.Equal(t, holder.Token, stamped)

	// From the shell, as the app role through PgBouncer.
	shell := []string{"--pooler", "transaction"}
	r := runDB(t, appURL, append(shell, "grant", "--quota", "q", "--member", "m")...)
	require.Equal(t, cli.ExitDenied, r.code, "the sixth grant of m: %s", r.stderr)
	ok(t, appURL, append(shell, "grant", "--quota", "q", "--member", "shell")...)
	requireError(t, runDB(t, appURL, append(shell, "fence", "write", "--resource", "job", "--key", "k",
		"--value", "stale", "--token", strconv.FormatInt(old.Token, 10))...), cli.ExitDenied, fmt.Sprintf("stale fencing token %d", old.Token))

	// Plain SQL as the app role: no write on pgquota's tables, no DDL.
	pool := pgcluster.Pool(t, appURL+"&default_query_exec_mode=exec")
	for _, stmt := range []string{
		`UPDATE pgquota.usage SET used = 0`,
		`UPDATE pgquota.quota SET default_limit = 1000`,
		`INSERT INTO pgquota.fence (resource, max_token) VALUES ('job', 1)`,
		`CREATE TABLE public.app_made (id int)`,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.ErrorContains(t, err, "permission denied", stmt)
	}
	u, err = clients[0].Usage(ctx, "q", "m")
	require.NoError(t, err)
	require.EqualValues(t, 5, u.Used)
}
