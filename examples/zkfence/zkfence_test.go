package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/netpause"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/internal/zkserver"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// setup returns a fresh migrated database's pool (through PgBouncer and as
// the application role when the test environment says so) and pgquota's
// fence client on it.
func setup(t *testing.T) (*pgxpool.Pool, *fence.Client, string) {
	t.Helper()
	dbURL := pgtest.NewURL(t)
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

// connect opens a session and waits until it is made; dialer nil means a
// plain TCP connection.
func connect(t *testing.T, addr string, session time.Duration, dialer zk.Dialer) *zk.Conn {
	t.Helper()
	if dialer == nil {
		dialer = net.DialTimeout
	}
	conn, _, err := zk.Connect([]string{addr}, session, zk.WithLogInfo(false), zk.WithDialer(dialer))
	require.NoError(t, err)
	t.Cleanup(conn.Close)
	// The server answers (zkserver waits for it); the session is made in
	// the background: wait for it rather than race the first request.
	require.NoError(t, WaitSession(context.Background(), conn, time.Minute))
	return conn
}

// TestZooKeeperTokenRefusesHolderPausedPastSession: holder 1 takes the lock
// and then goes silent (its connection blackholed) past its 500ms session;
// the real server expires the session and holder 2 gets the lock with a
// higher sequence number and writes. When holder 1 wakes and writes with
// its token, the write is refused (ErrStaleToken, highest = holder 2's
// token) and the row keeps holder 2's value and token.
func TestZooKeeperTokenRefusesHolderPausedPastSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := zkserver.Shared(t)
	_, qc, _ := setup(t)
	lockPath := fmt.Sprintf("/zkfence-test/%s", t.Name())

	hole := netpause.New()
	c1 := connect(t, srv.Addr, 500*time.Millisecond, hole.ZKDial)
	h1, err := Lock(c1, lockPath, 1)
	require.NoError(t, err)
	_, err = h1.Write(ctx, qc, "report", "total", "from holder 1, before its pause")
	require.NoError(t, err)

	hole.Hold() // holder 1 pauses: no heartbeat reaches the server
	c2 := connect(t, srv.Addr, 5*time.Second, nil)
	start := time.Now()
	h2, err := Lock(c2, lockPath, 1) // waits until holder 1's session expired
	require.NoError(t, err)
	t.Logf("holder 2 got the lock %s after holder 1 went silent; tokens %d then %d", time.Since(start), h1.Token, h2.Token)
	require.Greater(t, h2.Seq, h1.Seq)
	require.Greater(t, h2.Token, h1.Token)
	_, err = h2.Write(ctx, qc, "report", "total", "from holder 2")
	require.NoError(t, err)
	hole.Release() // holder 1 wakes and, believing it holds the lock, writes

	_, err = h1.Write(ctx, qc, "report", "total", "stale write from holder 1")
	require.ErrorIs(t, err, fence.ErrStaleToken)
	var stale *fence.StaleTokenError
	require.True(t, errors.As(err, &stale))
	require.Equal(t, h1.Token, stale.Token)
	require.Equal(t, h2.Token, stale.Highest)
	row, err := qc.Row(ctx, "report", "total")
	require.NoError(t, err)
	require.Equal(t, "from holder 2", row.Value)
	require.Equal(t, h2.Token, row.Token)
	require.NoError(t, h2.Unlock())
}

// TestZooKeeperNewEnsembleNeedsEpochBump: sequence numbers restart on a new
// ensemble, so its first holder's token of the same epoch is below the
// resource's mark and refused (safe, but stuck); with the epoch bumped it
// is admitted, and a holder of the old ensemble is refused from then on.
func TestZooKeeperNewEnsembleNeedsEpochBump(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	oldSrv := zkserver.Shared(t)
	_, qc, _ := setup(t)
	lockPath := fmt.Sprintf("/zkfence-test/%s", t.Name())

	oldConn := connect(t, oldSrv.Addr, 5*time.Second, nil)
	var old *Holder
	for range 3 { // a few holders: the old ensemble's sequence numbers reach 2
		if old != nil {
			require.NoError(t, old.Unlock())
		}
		h, err := Lock(oldConn, lockPath, 1)
		require.NoError(t, err)
		_, err = h.Write(ctx, qc, "report", "total", fmt.Sprintf("old ensemble, seq %d", h.Seq))
		require.NoError(t, err)
		old = h
	}
	require.Equal(t, int64(2), old.Seq)

	newSrv := zkserver.StartTB(t, zkserver.Options{})
	newConn := connect(t, newSrv.Addr, 5*time.Second, nil)
	h, err := Lock(newConn, lockPath, 1)
	require.NoError(t, err)
	require.Equal(t, int64(0), h.Seq, "a new ensemble starts its sequence numbers again")
	_, err = h.Write(ctx, qc, "report", "total", "new ensemble, epoch 1")
	require.ErrorIs(t, err, fence.ErrStaleToken, "a restarted sequence number in the same epoch is below the mark")
	require.NoError(t, h.Unlock())

	h, err = Lock(newConn, lockPath, 2)
	require.NoError(t, err)
	row, err := h.Write(ctx, qc, "report", "total", "new ensemble, epoch 2")
	require.NoError(t, err)
	require.Equal(t, int64(2)<<32+h.Seq, row.Token)

	_, err = old.Write(ctx, qc, "report", "total", "old ensemble's holder, late")
	require.ErrorIs(t, err, fence.ErrStaleToken)
	row, err = qc.Row(ctx, "report", "total")
	require.NoError(t, err)
	require.Equal(t, "new ensemble, epoch 2", row.Value)
}

// TestZooKeeperFenceCommandWrites runs the example program as a user would:
// it takes the lock, writes with its token and prints them.
func TestZooKeeperFenceCommandWrites(t *testing.T) {
	t.Parallel()
	srv := zkserver.Shared(t)
	_, qc, dbURL := setup(t)
	if pgtest.AppRoleMode() {
		dbURL = pgtest.SuiteURL(t, dbURL)
	}
	var out bytes.Buffer
	err := run(context.Background(), []string{"--zookeeper", srv.Addr, "--database-url", pgtest.PoolURL(t, dbURL),
		"--lock", "/zkfence-test/command", "--resource", "report", "--key", "total", "--value", "42", "--epoch", "3"}, &out)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("wrote report/total = \"42\" with token %d (epoch 3, sequence 0)\n", int64(3)<<32), out.String())
	row, err := qc.Row(context.Background(), "report", "total")
	require.NoError(t, err)
	require.Equal(t, "42", row.Value)
}
