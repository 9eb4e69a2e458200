package quota_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// requireStored checks that a keyed result's ledger entry holds that very
// outcome under its grant id.
func requireStored(t *testing.T, b *testBundle, res quota.GrantResult) {
	t.Helper()
	require.Positive(t, res.GrantID)
	e, err := b.client.LedgerEntry(b.ctx, res.GrantID)
	require.NoError(t, err)
	require.Equal(t, quota.OpGrant, e.Operation)
	require.Equal(t, res.IdempotencyKey, e.IdempotencyKey)
	require.Equal(t, res.Member, e.Member)
	require.Equal(t, res.Amount, e.Amount)
	require.Equal(t, res.Granted, e.Granted, "grant %d", res.GrantID)
	require.Equal(t, res.Used, e.Used, "grant %d", res.GrantID)
	require.Equal(t, res.Limit, e.Limit, "grant %d", res.GrantID)
	require.Equal(t, res.WindowEnd, e.WindowEnd)
}

func TestGrantBatchKeyed(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	defineBatchQuotas(t, b) // q: default limit 12
	reqs := []quota.GrantRequest{
		{Quota: "q", Member: "m", Amount: 5, Idempotency: key("k1")},
		{Quota: "q", Member: "m", Amount: 4},                                 // unkeyed
		{Quota: "q", Member: "m", Amount: 5, Idempotency: key("k2")},         // denied: 9 + 5 > 12
		{Quota: "q", Member: "m", Amount: 5, Idempotency: key("k1")},         // the same key and request: replays k1
		{Quota: "q", Member: "m", Amount: 2, Idempotency: key("k1")},         // the same key, another request
		{Quota: "q", Member: "m", Amount: 3, Idempotency: key("k3")},         // granted: 12
		{Quota: "nodefault", Member: "m", Amount: 1, Idempotency: key("k4")}, // no limit: not recorded
		{Quota: "q", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k1", Scope: "other"}},
	}
	outs, err := b.client.GrantBatch(b.ctx, reqs)
	require.NoError(t, err)
	require.NoError(t, outs[0].Err)
	require.True(t, outs[0].Granted)
	require.Equal(t, int64(5), outs[0].Used)
	require.False(t, outs[0].Replayed)
	requireStored(t, b, outs[0].GrantResult)

	require.NoError(t, outs[1].Err)
	require.True(t, outs[1].Granted)
	require.Equal(t, int64(9), outs[1].Used)
	require.Zero(t, outs[1].GrantID, "an unkeyed request has no grant id")

	require.False(t, outs[2].Granted)
	require.Equal(t, int64(9), outs[2].Used)
	requireStored(t, b, outs[2].GrantResult)

	require.NoError(t, outs[3].Err)
	require.True(t, outs[3].Replayed)
	require.Equal(t, outs[0].GrantID, outs[3].GrantID)
	require.Equal(t, outs[0].Used, outs[3].Used)

	require.ErrorIs(t, outs[4].Err, quota.ErrIdempotencyKeyReused)
	require.False(t, outs[4].Granted)

	require.True(t, outs[5].Granted)
	require.Equal(t, int64(12), outs[5].Used)
	requireStored(t, b, outs[5].GrantResult)

	require.ErrorIs(t, outs[6].Err, quota.ErrNoLimit)
	_, err = b.client.LedgerEntryByKey(b.ctx, quota.IdempotencyKey{Key: "k4", Scope: "nodefault"})
	require.ErrorIs(t, err, quota.ErrGrantNotFound, "nothing recorded for a request without a limit")

	require.False(t, outs[7].Granted, "another scope is another key; the counter is full")
	requireStored(t, b, outs[7].GrantResult)

	ids := map[int64]bool{}
	for _, i := range []int{0, 2, 5, 7} {
		require.False(t, ids[outs[i].GrantID], "every recorded request has its own grant id")
		ids[outs[i].GrantID] = true
	}
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(12), sum)

	// The whole batch again: the keyed requests replay, the unkeyed one is
	// a new request (denied: the counter is full).
	again, err := b.client.GrantBatch(b.ctx, reqs)
	require.NoError(t, err)
	for _, i := range []int{0, 2, 3, 5, 7} {
		require.NoError(t, again[i].Err)
		require.True(t, again[i].Replayed, "request %d", i)
		require.Equal(t, outs[i].GrantID, again[i].GrantID)
		require.Equal(t, outs[i].Granted, again[i].Granted)
		require.Equal(t, outs[i].Used, again[i].Used)
	}
	require.False(t, again[1].Granted)
	require.ErrorIs(t, again[4].Err, quota.ErrIdempotencyKeyReused)
	sum, _ = b.usageRows(t, "q", "m")
	require.Equal(t, int64(12), sum, "nothing granted twice")

	// A keyed single Grant sees the batch's entries, and the other way.
	r, err := b.client.Grant(b.ctx, reqs[0])
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.Equal(t, outs[0].GrantID, r.GrantID)
	single, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "n", Amount: 1, Idempotency: key("s1")})
	require.NoError(t, err)
	outs, err = b.client.GrantBatch(b.ctx, []quota.GrantRequest{{Quota: "q", Member: "n", Amount: 1, Idempotency: key("s1")}})
	require.NoError(t, err)
	require.True(t, outs[0].Replayed)
	require.Equal(t, single.GrantID, outs[0].GrantID)

	// CompensateGrant gives a batch grant's units back.
	rg, err := b.client.CompensateGrant(b.ctx, again[0].GrantID)
	require.NoError(t, err)
	require.Equal(t, int64(5), rg.Revoked)
}

func TestGrantBatchKeyedTxRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	defineBatchQuotas(t, b)
	tx, err := b.pool.BeginTx(b.ctx, readCommitted)
	require.NoError(t, err)
	outs, err := b.client.GrantBatchTx(b.ctx, tx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1, Idempotency: key("k")}})
	require.NoError(t, err)
	require.True(t, outs[0].Granted)
	require.NoError(t, tx.Rollback(b.ctx))
	require.Zero(t, b.countRows(t, "ledger"))
	require.Zero(t, b.countRows(t, "usage"))
	outs, err = b.client.GrantBatch(b.ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1, Idempotency: key("k")}})
	require.NoError(t, err)
	require.True(t, outs[0].Granted)
	require.False(t, outs[0].Replayed, "the rolled-back key is free again")
}

func TestCoalesceKeyed(t *testing.T) {
	t.Parallel()
	// 300 coalesced calls on one counter, limit 100: 200 distinct keys
	// called once, and 25 keys called 4 times each (concurrent copies).
	// Every key is decided once, with its own grant id and ledger entry;
	// its copies replay it; exactly 100 units are granted.
	const limit = 100
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})
	c := b.coalescing(t, quota.Config{})
	type call struct{ key string }
	var calls []call
	for i := range 200 {
		calls = append(calls, call{fmt.Sprint("single-", i)})
	}
	for i := range 25 {
		for range 4 {
			calls = append(calls, call{fmt.Sprint("copy-", i)})
		}
	}
	results := make([]quota.GrantResult, len(calls))
	errs := make([]error, len(calls))
	concurrently(len(calls), func(i int) {
		results[i], errs[i] = c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "hot", Amount: 1, Idempotency: key(calls[i].key)})
	})
	byKey := map[string][]quota.GrantResult{}
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, calls[i].key, r.IdempotencyKey)
		byKey[r.IdempotencyKey] = append(byKey[r.IdempotencyKey], r)
	}
	var firsts []quota.GrantResult
	ids := map[int64]bool{}
	for k, rs := range byKey {
		var first *quota.GrantResult
		for i := range rs {
			if !rs[i].Replayed {
				require.Nil(t, first, "key %s decided twice", k)
				first = &rs[i]
			}
		}
		require.NotNil(t, first, "key %s decided once", k)
		for _, r := range rs {
			require.Equal(t, first.GrantID, r.GrantID)
			require.Equal(t, first.Granted, r.Granted)
			require.Equal(t, first.Used, r.Used)
		}
		require.False(t, ids[first.GrantID])
		ids[first.GrantID] = true
		requireStored(t, b, *first)
		firsts = append(firsts, *first)
	}
	require.Len(t, firsts, 225)
	sum, _ := b.usageRows(t, "q", "hot")
	require.Equal(t, int64(limit), sum)
	checkChain(t, firsts, sum)
	require.Equal(t, int64(225), b.ledgerRows(t), "one ledger entry, with its outcome, per key")
}

func TestCoalesceKeyedAbandonedIsRetrievable(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
	var mu sync.Mutex
	var abandoned []quota.GrantResult
	c := b.coalescing(t, quota.Config{OnAbandonedGrant: func(_ quota.GrantRequest, res quota.GrantResult, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("abandoned call: %v", err)
		}
		abandoned = append(abandoned, res)
	}})
	sent := make(chan int, 1)
	release := make(chan struct{})
	quota.SetCoalesceSend(c, func(n int) {
		sent <- n
		<-release
	})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Idempotency: key("order-1")})
		done <- err
	}()
	require.Equal(t, 1, <-sent)
	cancel()
	require.ErrorIs(t, <-done, quota.ErrGrantAbandoned)
	close(release)
	waitFor(t, "the abandoned outcome", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(abandoned) == 1
	})
	// Repeating the call with its key returns the stored outcome.
	r, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Idempotency: key("order-1")})
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.True(t, r.Granted)
	require.Equal(t, abandoned[0].GrantID, r.GrantID)
	require.Equal(t, int64(3), r.Used)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(3), sum)
}
