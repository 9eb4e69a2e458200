package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/fencedgrant"
	"github.com/pgquota/pgquota/internal/pgbouncer"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// pooledClient returns a client whose pool goes through b to a fresh
// migrated database, in pgx's exec mode, the client for its operator work
// (itself in the normal pass; under PGQUOTA_TEST_APP_ROLE=1 one through b
// as the operator's role), and the pooled URL.
func pooledClient(t *testing.T, b *pgbouncer.Bouncer, cfg *quota.Config, maxConns int32) (c, op *quota.Client, u string) {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	u, err := b.URL(pgtest.SuiteURL(t, dbURL) + "&default_query_exec_mode=exec") // the role the pool connects as
	require.NoError(t, err)
	c, err = quota.New(pgtest.Connect(t, u, maxConns), cfg)
	require.NoError(t, err)
	op = c
	if pgtest.AppRoleMode() {
		ou, err := b.URL(pgtest.OperatorURL(t, dbURL) + "&default_query_exec_mode=exec")
		require.NoError(t, err)
		op, err = quota.New(pgtest.ConnectOperator(t, ou, 1), cfg)
		require.NoError(t, err)
	}
	return c, op, u
}

// Behind a real PgBouncer in transaction mode (pool of 3), AcquireWait
// with default options and GrantFenced under contention used to LISTEN on
// pgquota_lease through the pooler: the LISTEN stayed on pooled server
// connections after the clients had gone, and PgBouncer logged "got packet
// 'A' from server when not linked" for every release announced to them.
// With Config.Pooler = PoolerTransaction no server connection listens
// after the calls, and waiting still works (by polling).
func TestPoolerTransactionLeavesNoListen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pgbouncer.Start(t, pgtest.BaseURL(t), pgbouncer.Options{})
	cfg := &quota.Config{Pooler: quota.PoolerTransaction}

	t.Run("AcquireWait", func(t *testing.T) {
		c, _, u := pooledClient(t, b, cfg, 4)
		l, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: "r", Holder: "first", TTL: time.Minute})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := leaseOf(t, c).AcquireWait(ctx, lease.AcquireRequest{Name: "r", Holder: "second", TTL: time.Minute}, nil)
			done <- err
		}()
		time.Sleep(300 * time.Millisecond)
		_, err = leaseOf(t, c).Release(ctx, lease.Lease{Name: "r", Token: l.Token})
		require.NoError(t, err)
		require.NoError(t, <-done)
		w, err := leaseOf(t, c).Get(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, "second", w.Holder)
		c.Pool().Close()
		chs, err := b.ServerChannels(ctx, u)
		require.NoError(t, err)
		require.Empty(t, chs, "server connections still LISTENing after the client left")
		require.NotContains(t, b.Log(), "got packet 'A'", "a NOTIFY reached a server connection no client was linked to")
	})

	t.Run("GrantFenced", func(t *testing.T) {
		c, op, u := pooledClient(t, b, cfg, 8)
		_, err := op.DefineQuota(ctx, quota.Definition{Name: "q", DefaultLimit: ptr(int64(100)), Window: quota.WindowNone})
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for range 20 {
			wg.Go(func() {
				_, err := fencedgrant.Grant(ctx, c, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, 0)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		u2, err := c.Usage(ctx, "q", "m")
		require.NoError(t, err)
		require.EqualValues(t, 20, u2.Used)
		c.Pool().Close()
		chs, err := b.ServerChannels(ctx, u)
		require.NoError(t, err)
		require.Empty(t, chs, "server connections still LISTENing after the client left")
		require.NotContains(t, b.Log(), "got packet 'A'", "a NOTIFY reached a server connection no client was linked to")
	})
}
