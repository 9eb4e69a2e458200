package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/pgquota/pgquota/internal/etcdserver"
	"github.com/pgquota/pgquota/internal/netpause"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// setup returns a fresh migrated database with the table public.reports
// (row id 1) under pgquota's fence guard, attached by the owner with
// external (true: for etcd tokens) or for lease tokens; the pool (through
// PgBouncer and as the application role when the test environment says so)
// and pgquota's fence client on it.
func setup(t *testing.T, external bool) (*pgxpool.Pool, *fence.Client, string) {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	owner := pgtest.ConnectOwner(t, dbURL, 2)
	_, err := owner.Exec(ctx, `CREATE TABLE public.reports (id int PRIMARY KEY, value bigint NOT NULL, fence_token bigint);
		GRANT SELECT, INSERT, UPDATE, DELETE ON public.reports TO pgquota_app`)
	require.NoError(t, err)
	oq, err := quota.New(owner, nil)
	require.NoError(t, err)
	oc, err := fence.New(oq)
	require.NoError(t, err)
	ol, err := lease.New(oq)
	require.NoError(t, err)
	_, err = oc.GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "fence_token", External: external})
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `BEGIN; SELECT pgquota.present_token('public.reports', 1); INSERT INTO public.reports (id, value) VALUES (1, 0); COMMIT`)
	if !external {
		// A lease-backed table takes the first row under a lease.
		_, err = owner.Exec(ctx, `ROLLBACK`)
		require.NoError(t, err)
		l, aerr := ol.Acquire(ctx, lease.AcquireRequest{Name: "public.reports", Holder: "setup", TTL: time.Minute})
		require.NoError(t, aerr)
		err = pgx.BeginFunc(ctx, owner, func(tx pgx.Tx) error {
			if err := oc.PresentTokenTx(ctx, tx, fence.PresentTokenRequest{Resource: "public.reports", Token: l.Token}); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO public.reports (id, value) VALUES (1, 0)`)
			return err
		})
		require.NoError(t, err)
		_, err = ol.Release(ctx, l)
	}
	require.NoError(t, err)
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), 4)
	cfg := &quota.Config{}
	if pgtest.Pooled(t) {
		cfg.Pooler = quota.PoolerTransaction
	}
	q, err := quota.New(pool, cfg)
	require.NoError(t, err)
	qc, err := fence.New(q)
	require.NoError(t, err)
	return pool, qc, dbURL
}

func client(t *testing.T, endpoint string, hole *netpause.Blackhole) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if hole != nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(hole.Dial)}
	}
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func row(t *testing.T, pool *pgxpool.Pool) (value, token int64) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT value, fence_token FROM public.reports WHERE id = 1`).Scan(&value, &token))
	return value, token
}

// TestEtcdRevisionRefusesHolderPausedPastLease: holder 1 takes the lock on
// a 1-second lease and then goes silent (its connection blackholed); the
// real server revokes the lease and holder 2 gets the lock with a higher
// create revision and writes. Holder 1's late write is refused
// (ErrStaleToken, highest = holder 2's token, nothing written), and a
// statement that presents no token is refused too (ErrTokenNotPresented).
func TestEtcdRevisionRefusesHolderPausedPastLease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := etcdserver.Shared(t)
	pool, qc, _ := setup(t, true)
	prefix := "/etcdfence-test/" + t.Name()

	hole := netpause.New()
	h1, err := Lock(ctx, client(t, srv.Endpoint, hole), prefix, 1, 1)
	require.NoError(t, err)
	require.NoError(t, h1.Write(ctx, pool, qc, "public.reports", 1, 10))

	hole.Hold() // holder 1 pauses: no keepalive reaches the server
	start := time.Now()
	h2, err := Lock(ctx, client(t, srv.Endpoint, nil), prefix, 10, 1) // waits until holder 1's lease is revoked
	require.NoError(t, err)
	t.Logf("holder 2 got the lock %s after holder 1 went silent; tokens %d then %d", time.Since(start), h1.Token, h2.Token)
	require.Greater(t, h2.Revision, h1.Revision)
	require.NoError(t, h2.Write(ctx, pool, qc, "public.reports", 1, 20))
	hole.Release() // holder 1 wakes and, believing it holds the lock, writes

	err = h1.Write(ctx, pool, qc, "public.reports", 1, 11)
	require.ErrorIs(t, err, fence.ErrStaleToken)
	var stale *fence.StaleTokenError
	require.True(t, errors.As(err, &stale))
	require.Equal(t, h1.Token, stale.Token)
	require.Equal(t, h2.Token, stale.Highest)
	v, tok := row(t, pool)
	require.Equal(t, int64(20), v)
	require.Equal(t, h2.Token, tok)

	_, err = pool.Exec(ctx, `UPDATE public.reports SET value = 99 WHERE id = 1`)
	require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented)
	require.NoError(t, h2.Unlock(ctx))
}

// TestEtcdNewClusterNeedsEpochBump: revisions restart on a new cluster (or
// go back on a restore), so its first holder's token of the same epoch is
// below the table's mark and refused (safe, but stuck); with the epoch
// bumped it is admitted, and a holder of the old cluster is refused from
// then on.
func TestEtcdNewClusterNeedsEpochBump(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	oldSrv := etcdserver.Shared(t)
	pool, qc, _ := setup(t, true)
	prefix := "/etcdfence-test/" + t.Name()
	oldCli := client(t, oldSrv.Endpoint, nil)
	for i := range 20 { // the old cluster's revisions move on
		_, err := oldCli.Put(ctx, fmt.Sprintf("/etcdfence-filler/%s/%d", t.Name(), i), "x")
		require.NoError(t, err)
	}
	old, err := Lock(ctx, oldCli, prefix, 10, 1)
	require.NoError(t, err)
	require.NoError(t, old.Write(ctx, pool, qc, "public.reports", 1, 1))

	newSrv := etcdserver.StartTB(t, etcdserver.Options{})
	newCli := client(t, newSrv.Endpoint, nil)
	h, err := Lock(ctx, newCli, prefix, 10, 1)
	require.NoError(t, err)
	require.Less(t, h.Revision, old.Revision, "a new cluster starts its revisions again")
	require.ErrorIs(t, h.Write(ctx, pool, qc, "public.reports", 1, 2), fence.ErrStaleToken,
		"a restarted revision in the same epoch is below the mark")
	require.NoError(t, h.Unlock(ctx))

	h, err = Lock(ctx, newCli, prefix, 10, 2)
	require.NoError(t, err)
	require.Equal(t, int64(2)<<40+h.Revision, h.Token)
	require.NoError(t, h.Write(ctx, pool, qc, "public.reports", 1, 3))
	require.ErrorIs(t, old.Write(ctx, pool, qc, "public.reports", 1, 4), fence.ErrStaleToken)
	v, tok := row(t, pool)
	require.Equal(t, int64(3), v)
	require.Equal(t, h.Token, tok)
}

// TestEtcdTokenOnLeaseGuardedTableRefused: on a table guarded for pgquota
// lease tokens (attached without External), an etcd token is refused:
// presented, it holds no pgquota lease (ErrLeaseLost, PQ002); as a
// WriteFencedRow without a lease on the table's resource, a token above every
// token pgquota's leases issued (pgquota.lease_token_ceiling) is refused
// with PQ002 too, so it cannot lock the lease holders out. Nothing is
// written.
func TestEtcdTokenOnLeaseGuardedTableRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := etcdserver.Shared(t)
	pool, qc, _ := setup(t, false)
	var ceiling int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgquota.lease_token_ceiling()`).Scan(&ceiling))
	epoch := ceiling>>fence.EtcdRevisionBits + 1 // an epoch above pgquota's own
	h, err := Lock(ctx, client(t, srv.Endpoint, nil), "/etcdfence-test/"+t.Name(), 10, epoch)
	require.NoError(t, err)
	defer func() { _ = h.Unlock(ctx) }()
	require.Greater(t, h.Token, ceiling)

	err = h.Write(ctx, pool, qc, "public.reports", 1, 5)
	require.ErrorIs(t, err, lease.ErrLost)
	_, err = qc.WriteRow(ctx, fence.WriteRowRequest{Resource: "public.reports", Key: "k", Value: "v", Token: h.Token})
	require.ErrorIs(t, err, lease.ErrLost)
	// The table is bound to the pgquota lease named like it: an etcd
	// revision is not that lease's token (PQ002, lease lost).
	require.Contains(t, err.Error(), "is not held with token")
	v, _ := row(t, pool)
	require.Equal(t, int64(0), v)
	var fenceRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.fenced_row WHERE resource = 'public.reports'`).Scan(&fenceRows))
	require.Zero(t, fenceRows)
}

// TestEtcdFenceCommandWrites runs the example program as a user would.
func TestEtcdFenceCommandWrites(t *testing.T) {
	t.Parallel()
	srv := etcdserver.Shared(t)
	pool, _, dbURL := setup(t, true)
	if pgtest.AppRoleMode() {
		dbURL = pgtest.SuiteURL(t, dbURL)
	}
	var out bytes.Buffer
	err := run(context.Background(), []string{"--etcd", srv.Endpoint, "--database-url", pgtest.PoolURL(t, dbURL),
		"--lock", "/etcdfence-test/command", "--table", "public.reports", "--id", "1", "--value", "42", "--epoch", "3"}, &out)
	require.NoError(t, err)
	require.Regexp(t, `^wrote public.reports id 1 = 42 with token \d+ \(epoch 3, create revision \d+\)\n$`, out.String())
	v, tok := row(t, pool)
	require.Equal(t, int64(42), v)
	require.Equal(t, int64(3), tok>>40)
}
