package quota_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A keyed GrantBatch records its keys first, then grants. A member's own
// limit (the only limit of a quota without a default) removed in between,
// while the batch waited for another request's key, must not fail the
// whole batch: GrantBatch reports a request without a limit in its own
// outcome (ErrNoLimit) "and does not stop the others", and the other
// requests, unkeyed ones included, are decided.
func TestGrantBatchKeyedLimitRemovedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "nodefault", Window: quota.WindowNone})
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
	_, err := b.operator.SetMemberLimit(b.ctx, "nodefault", "m", 10)
	require.NoError(t, err)

	// Another transaction holds key "k2" (scope "s") for a while.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	k2 := quota.GrantRequest{Quota: "q", Member: "x", Amount: 1, Idempotency: quota.IdempotencyKey{Scope: "s", Key: "k2"}}
	first, err := b.client.GrantTx(b.ctx, tx, k2)
	require.NoError(t, err)
	require.True(t, first.Granted)

	reqs := []quota.GrantRequest{
		{Quota: "nodefault", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Scope: "s", Key: "k1"}},
		k2, // waits for tx
		{Quota: "q", Member: "y", Amount: 1},
	}
	type result struct {
		outs []quota.BatchOutcome
		err  error
	}
	done := make(chan result, 1)
	go func() {
		outs, err := b.client.GrantBatch(b.ctx, reqs)
		done <- result{outs, err}
	}()
	b.waitForLockWait(t) // k1 is recorded, the batch waits for k2

	cleared, err := b.operator.ClearMemberLimit(b.ctx, "nodefault", "m")
	require.NoError(t, err)
	require.True(t, cleared)
	require.NoError(t, tx.Commit(b.ctx))

	r := <-done
	require.NoError(t, r.err, "one request's limit vanished; the batch is still decided")
	require.ErrorIs(t, r.outs[0].Err, quota.ErrNoLimit)
	require.NoError(t, r.outs[1].Err)
	require.True(t, r.outs[1].Replayed)
	require.Equal(t, first.GrantID, r.outs[1].GrantID)
	require.NoError(t, r.outs[2].Err)
	require.True(t, r.outs[2].Granted)
	sum, _ := b.usageRows(t, "nodefault", "m")
	require.Zero(t, sum)
	_, err = b.client.LedgerEntryByKey(b.ctx, quota.IdempotencyKey{Scope: "s", Key: "k1"})
	require.ErrorIs(t, err, quota.ErrGrantNotFound, "nothing recorded for a request without a limit")
}
