package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// A panic in fn (recovered further up, as net/http recovers a handler's
// panic) must roll the transaction back and give its connection back to
// the pool, as pgx.BeginFunc does with its deferred Rollback. Otherwise
// the leaked transaction stays open ("idle in transaction") holding the
// lease row FOR KEY SHARE, so a successor can never acquire the lease
// after the holder's TTL ran out, and pool.Close waits for the leaked
// connection forever.
func TestRunTxPanicInFnRollsBackAndFreesTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)
	a := b.acquire(t, g.Resource, "A", 300*time.Millisecond)

	// A pool of its own that the test never closes: with the bug, Close
	// would hang on the leaked connection (pgtest drops the database,
	// ending its sessions, when the test ends).
	cfg := b.pool.Config().Copy()
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	client, err := quota.New(pool, testConfig(t, nil))
	require.NoError(t, err)

	func() {
		defer func() { require.NotNil(t, recover(), "fn's panic propagates") }()
		_ = fenceOf(t, client).RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: a.Token}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`); err != nil {
				return err
			}
			panic("boom")
		})
	}()

	assert.Zero(t, pool.Stat().AcquiredConns(), "the panicking RunTx gave its connection back to the pool")

	time.Sleep(500 * time.Millisecond) // A's TTL ends
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	_, err = leaseOf(t, b.operator).Acquire(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "B", TTL: time.Minute})
	assert.NoError(t, err, "a successor acquires the lease once A's TTL ran out")
	require.Empty(t, b.rowsOf(t, "orders"))
	if t.Failed() {
		// End the leaked session so the database can be dropped.
		_, _ = b.owner.Exec(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()`)
	}
}
