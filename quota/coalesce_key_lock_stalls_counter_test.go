package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A coalesced keyed call whose key is held by another, still open
// transaction (the first copy of a retried request, inside a caller's
// transaction) waits for that transaction, as it must. The other calls for
// the same counter, which need nothing that transaction holds (it holds
// the key only: its grant was denied, so it locked no counter row), must
// not wait with it: without Config.Coalesce they are decided at once, and
// coalescing promises each call the outcome it would get without.
func TestCoalesceKeyLockStallsCounter(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](100)})
	c := b.coalescing(t, quota.Config{})
	stuck := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1000, Idempotency: key("order-1")}

	// The first copy, in a transaction that stays open: denied (1000 > 100),
	// it holds the key and no counter lock.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	first, err := b.client.GrantTx(b.ctx, tx, stuck)
	require.NoError(t, err)
	require.False(t, first.Granted)

	// Without coalescing, another caller of the counter is decided at once.
	plain, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.True(t, plain.Granted)

	// The retry of the first copy, coalesced: it waits for the key.
	retried := make(chan error, 1)
	go func() {
		_, err := c.Grant(b.ctx, stuck)
		retried <- err
	}()
	b.waitForLockWait(t)

	// A coalesced unkeyed caller of the same counter.
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	r, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err, "after %s, while another call's key was locked", time.Since(start).Round(time.Millisecond))
	require.True(t, r.Granted)
	require.Equal(t, int64(2), r.Used)

	require.NoError(t, tx.Commit(b.ctx))
	require.NoError(t, <-retried)
}
