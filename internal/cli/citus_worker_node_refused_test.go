//go:build citus

package cli_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// pgquota runs on the Citus coordinator only. Pointed at a worker node's
// database (which has pgquota's schema, propagated, but not its version
// rows, token sequence, advisory locks or clock), every command refuses
// and names the coordinator: migrate up, migrate status, grant, lease
// acquire; CheckSchema returns *migrations.CitusWorkerError
// (quota.ErrCitusWorker); and a Go client that skipped CheckSchema has its
// lease calls and grants refused by the server (SQLSTATE PQ021,
// ErrCitusWorker), and so are the SQL interface's functions called with
// plain SQL on the worker (every decision reads pgquota.clock(), whose
// Citus body refuses a client of a worker), writing nothing. The
// coordinator is unaffected.
func TestCitusWorkerNodeIsRefusedNamingTheCoordinator(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	worker := c.Workers()[0].URL(cituscluster.Database)
	coordinator := fmt.Sprintf("127.0.0.1:%d", c.Coordinator.Port)
	ok(t, c.URL(), "quota", "define", "--name", "q", "--window", "day", "--limit", "5")

	for _, args := range [][]string{
		{"migrate", "up"},
		{"migrate", "status"},
		{"grant", "--quota", "q", "--member", "m"},
		{"lease", "acquire", "--name", "job", "--ttl", "10s"},
	} {
		r := runDB(t, worker, args...)
		require.NotEqual(t, 0, r.code, "%v on the worker: %s", args, r.stdout)
		require.Contains(t, r.stderr, "Citus worker node", "%v", args)
		require.Contains(t, r.stderr, "connect to the coordinator, "+coordinator, "%v", args)
	}

	qc, err := quota.New(pgcluster.Pool(t, worker), nil)
	require.NoError(t, err)
	err = qc.CheckSchema(ctx)
	require.ErrorIs(t, err, quota.ErrCitusWorker)
	var we *migrations.CitusWorkerError
	require.ErrorAs(t, err, &we)
	require.Equal(t, coordinator, we.Coordinator)

	lc, err := lease.New(qc)
	require.NoError(t, err)
	_, err = lc.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "w", TTL: 10 * time.Second})
	require.ErrorIs(t, err, quota.ErrCitusWorker)
	require.Contains(t, err.Error(), "lease_acquire on a Citus worker node")
	require.Equal(t, 1, strings.Count(err.Error(), "pgquota:"), "one prefix: %v", err)
	_, err = lc.AcquireSlot(ctx, lease.SlotRequest{Semaphore: "pool", Limit: 2, Holder: "w", TTL: 10 * time.Second})
	require.ErrorIs(t, err, quota.ErrCitusWorker)

	// The decisions of the Go library and of the SQL interface read the
	// coordinator's clock: on the worker they are refused, writing
	// nothing.
	_, err = qc.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.ErrorIs(t, err, quota.ErrCitusWorker)
	ok(t, c.URL(), "voucher", "create", "--campaign", "launch", "--total", "5")
	c.Exec(`CREATE TABLE public.guarded (id int PRIMARY KEY, fence_token bigint)`)
	ok(t, c.URL(), "fence", "guard", "--table", "public.guarded", "--column", "fence_token", "--external")
	requireError(t, runDB(t, worker, "migrate", "grant-app", "--role", "postgres"), cli.ExitError, "connect to the coordinator, "+coordinator)
	wp := pgcluster.Pool(t, worker)
	for _, stmt := range []string{
		// A proof minted on a worker could match a coordinator
		// transaction's id: none is minted there.
		`SELECT pgquota.present_token('public.guarded', 5, NULL)`,
		`SELECT * FROM pgquota.grant('q', 'm', 1)`,
		`SELECT * FROM pgquota.grant_keyed('orders', 'o-1', 'q', 'm', 1)`,
		`SELECT * FROM pgquota.revoke('q', 'm', 1)`,
		`SELECT * FROM pgquota.claim('launch', 'm')`,
		`SELECT * FROM pgquota.limit_usage('q', 'm')`,
	} {
		_, err := wp.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, stmt)
		require.Equal(t, migrations.SQLStateCitusWorker, pgErr.Code, stmt)
		require.Contains(t, pgErr.Message, "Citus worker node", stmt)
	}
	var written int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT (SELECT count(*) FROM pgquota.usage) + (SELECT count(*) FROM pgquota.voucher_claim) + (SELECT count(*) FROM pgquota.ledger)`, &written)
	require.Zero(t, written, "nothing written by the refused decisions")
	// The coordinator decides as before (its reads of shards on the
	// worker evaluate the clock there, over Citus's own connections).
	r := runDB(t, c.URL(), "grant", "--quota", "q", "--member", "m")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	ok(t, c.URL(), "usage", "--quota", "q", "--member", "m")

	// The coordinator's lease, released through the worker: refused, and
	// the lease is still held.
	cl, err := quota.New(c.Pool(), nil)
	require.NoError(t, err)
	require.NoError(t, cl.CheckSchema(ctx))
	clc, err := lease.New(cl)
	require.NoError(t, err)
	held, err := clc.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "c", TTL: time.Minute})
	require.NoError(t, err)
	_, err = lc.Renew(ctx, held, time.Hour)
	require.True(t, errors.Is(err, quota.ErrCitusWorker), "renew on the worker: %v", err)
	_, err = lc.Release(ctx, held)
	require.True(t, errors.Is(err, quota.ErrCitusWorker), "release on the worker: %v", err)
	cur, err := clc.Get(ctx, "job")
	require.NoError(t, err)
	require.Equal(t, held.Token, cur.Token)
	require.True(t, cur.ExpiresAt.After(cur.DBNow), "still held")
	var leases int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT count(*) FROM pgquota.lease`, &leases)
	require.Equal(t, 1, leases, "nothing written by the refused calls")
}
