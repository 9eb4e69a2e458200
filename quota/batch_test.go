package quota_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// defineBatchQuotas defines the quotas of the batch tests: "q" with a
// default limit of 12 and a member override, "nodefault" without a default
// limit.
func defineBatchQuotas(t *testing.T, b *testBundle) {
	t.Helper()
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](12)})
	b.define(t, quota.Definition{Name: "nodefault", Window: quota.WindowDay, TimeZone: "Europe/Berlin"})
	_, err := b.operator.SetMemberLimit(b.ctx, "q", "big", 30)
	require.NoError(t, err)
}

// randomRequests returns n requests over a few members and quotas, with
// amounts 1..4, some with a limit of their own, and a few bad ones.
func randomRequests(rng *rand.Rand, n int) []quota.GrantRequest {
	members := []string{"a", "b", "c", "big", "d"}
	reqs := make([]quota.GrantRequest, n)
	for i := range reqs {
		r := quota.GrantRequest{Quota: "q", Member: members[rng.IntN(len(members))], Amount: 1 + rng.Int64N(4)}
		switch rng.IntN(20) {
		case 0:
			r.Quota = "nodefault" // ErrNoLimit unless it has a limit
		case 1:
			r.Quota = "missing"
		case 2:
			r.Amount = 0 // bad input
		case 3:
			r.Member = ""
		}
		if rng.IntN(4) == 0 {
			r.Limit = ptr(rng.Int64N(20))
		}
		reqs[i] = r
	}
	return reqs
}

// sameOutcome requires a batch outcome to equal a single Grant's.
func sameOutcome(t *testing.T, i int, want quota.GrantResult, wantErr error, got quota.BatchOutcome) {
	t.Helper()
	if wantErr != nil {
		require.Error(t, got.Err, "request %d", i)
		for _, target := range []error{quota.ErrInvalidInput, quota.ErrQuotaNotFound, quota.ErrNoLimit} {
			require.Equal(t, errors.Is(wantErr, target), errors.Is(got.Err, target), "request %d: %v vs %v", i, wantErr, got.Err)
		}
		var we, ge *quota.InputError
		if errors.As(wantErr, &we) {
			require.ErrorAs(t, got.Err, &ge)
			require.Equal(t, we.Field, ge.Field)
		}
		require.False(t, got.Granted)
		return
	}
	require.NoError(t, got.Err, "request %d", i)
	require.Equal(t, want.Granted, got.Granted, "request %d", i)
	require.Equal(t, want.Used, got.Used, "request %d", i)
	require.Equal(t, want.Limit, got.Limit, "request %d", i)
	require.Equal(t, want.Remaining, got.Remaining, "request %d", i)
	require.Equal(t, want.Amount, got.Amount, "request %d", i)
	require.Equal(t, want.WindowEnd.IsZero(), got.WindowEnd.IsZero(), "request %d", i)
}

func TestGrantBatchMatchesSequentialGrants(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			batch, single := setup(t, 2), setup(t, 2)
			defineBatchQuotas(t, batch)
			defineBatchQuotas(t, single)
			// Some counters exist before (the update path), others not (the
			// insert path).
			warm := []quota.GrantRequest{
				{Quota: "q", Member: "a", Amount: 5},
				{Quota: "q", Member: "big", Amount: 20},
				{Quota: "nodefault", Member: "b", Amount: 1, Limit: ptr[int64](3)},
			}
			for _, r := range warm {
				_, err := batch.client.Grant(batch.ctx, r)
				require.NoError(t, err)
				_, err = single.client.Grant(single.ctx, r)
				require.NoError(t, err)
			}
			for range 3 {
				reqs := randomRequests(rng, 60)
				outs, err := batch.client.GrantBatch(batch.ctx, reqs)
				require.NoError(t, err)
				require.Len(t, outs, len(reqs))
				for i, r := range reqs {
					want, wantErr := single.client.Grant(single.ctx, r)
					sameOutcome(t, i, want, wantErr, outs[i])
				}
			}
			var a, b int64
			require.NoError(t, batch.pool.QueryRow(batch.ctx, `SELECT coalesce(sum(used), 0) FROM pgquota.usage`).Scan(&a))
			require.NoError(t, single.pool.QueryRow(single.ctx, `SELECT coalesce(sum(used), 0) FROM pgquota.usage`).Scan(&b))
			require.Equal(t, b, a, "the same units were granted")
		})
	}
}

func TestGrantBatchEmptyAndTx(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	defineBatchQuotas(t, b)
	outs, err := b.client.GrantBatch(b.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, outs)

	tx, err := b.pool.BeginTx(b.ctx, readCommitted)
	require.NoError(t, err)
	outs, err = b.client.GrantBatchTx(b.ctx, tx, []quota.GrantRequest{
		{Quota: "q", Member: "m", Amount: 5},
		{Quota: "q", Member: "m", Amount: 5},
		{Quota: "q", Member: "m", Amount: 5},
	})
	require.NoError(t, err)
	require.True(t, outs[0].Granted)
	require.True(t, outs[1].Granted)
	require.False(t, outs[2].Granted)
	require.Equal(t, int64(10), outs[2].Used)
	require.NoError(t, tx.Rollback(b.ctx))
	sum, rows := b.usageRows(t, "q", "m")
	require.Zero(t, sum)
	require.Zero(t, rows, "the batch rolled back with the caller's transaction")
}

// waitForLockWait waits until a session of b's database waits for a lock.
func waitForLockWait(t *testing.T, b *testBundle) {
	t.Helper()
	waitForLockWaits(t, b, 1)
}

func TestGrantBatchCounterCreatedMeanwhile(t *testing.T) {
	t.Parallel()
	// A transaction creates the counter after the batch statement's
	// snapshot: the batch's insert meets it (ON CONFLICT DO NOTHING) and
	// the requests are decided again on the committed counter.
	b := setup(t, 4)
	defineBatchQuotas(t, b)
	tx, err := b.pool.BeginTx(b.ctx, readCommitted)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	first, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 4})
	require.NoError(t, err)
	require.True(t, first.Granted)

	done := make(chan []quota.BatchOutcome, 1)
	go func() {
		outs, err := b.client.GrantBatch(b.ctx, []quota.GrantRequest{
			{Quota: "q", Member: "m", Amount: 5},
			{Quota: "q", Member: "m", Amount: 5},
			{Quota: "q", Member: "m", Amount: 2},
		})
		if err != nil {
			t.Errorf("GrantBatch: %v", err)
		}
		done <- outs
	}()
	waitForLockWait(t, b)
	require.NoError(t, tx.Commit(b.ctx))
	outs := <-done
	require.True(t, outs[0].Granted)
	require.Equal(t, int64(9), outs[0].Used)
	require.False(t, outs[1].Granted)
	require.Equal(t, int64(9), outs[1].Used)
	require.True(t, outs[2].Granted)
	require.Equal(t, int64(11), outs[2].Used)
	sum, rows := b.usageRows(t, "q", "m")
	require.Equal(t, int64(11), sum)
	require.Equal(t, int64(1), rows)
}

func TestGrantBatchCounterFilledMeanwhile(t *testing.T) {
	t.Parallel()
	// The snapshot shows room, but a transaction that holds the counter
	// fills it: the locking read's re-check fails and the batch decides
	// again on the committed counter (denied); when that transaction rolls
	// back instead, the batch gets the room.
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprint("commit ", commit), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4)
			defineBatchQuotas(t, b)
			_, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 8})
			require.NoError(t, err)
			tx, err := b.pool.BeginTx(b.ctx, readCommitted)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			_, err = b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 4})
			require.NoError(t, err)

			done := make(chan []quota.BatchOutcome, 1)
			go func() {
				outs, err := b.client.GrantBatch(b.ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 3}})
				if err != nil {
					t.Errorf("GrantBatch: %v", err)
				}
				done <- outs
			}()
			waitForLockWait(t, b)
			if commit {
				require.NoError(t, tx.Commit(b.ctx))
			} else {
				require.NoError(t, tx.Rollback(b.ctx))
			}
			outs := <-done
			require.NoError(t, outs[0].Err)
			if commit {
				require.False(t, outs[0].Granted)
				require.Equal(t, int64(12), outs[0].Used, "the denial reports the committed counter")
			} else {
				require.True(t, outs[0].Granted)
				require.Equal(t, int64(11), outs[0].Used)
			}
		})
	}
}

func TestGrantBatchConcurrentOverlapping(t *testing.T) {
	t.Parallel()
	// Concurrent batches over the same members, in different orders: no
	// deadlock, every counter at most its limit and equal to the units
	// reported granted.
	const (
		workers = 8
		batches = 15
		size    = 40
		members = 25
		limit   = 30
	)
	b := setup(t, workers)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})
	var mu sync.Mutex
	granted := map[string]int64{}
	var firstErr error
	concurrently(workers, func(w int) {
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		for range batches {
			reqs := make([]quota.GrantRequest, size)
			for i := range reqs {
				reqs[i] = quota.GrantRequest{Quota: "q", Member: fmt.Sprint("m", rng.IntN(members)), Amount: 1 + rng.Int64N(3)}
			}
			outs, err := b.client.GrantBatch(b.ctx, reqs)
			mu.Lock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			for _, o := range outs {
				if o.Err != nil && firstErr == nil {
					firstErr = o.Err
				}
				if o.Granted {
					granted[o.Member] += o.Amount
				}
			}
			mu.Unlock()
		}
	})
	require.NoError(t, firstErr)
	rows, err := b.pool.Query(b.ctx, `SELECT member, used FROM pgquota.usage`)
	require.NoError(t, err)
	counters, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		m string
		u int64
	}, error) {
		var v struct {
			m string
			u int64
		}
		err := r.Scan(&v.m, &v.u)
		return v, err
	})
	require.NoError(t, err)
	require.Len(t, counters, len(granted))
	for _, c := range counters {
		require.LessOrEqual(t, c.u, int64(limit))
		require.Equal(t, granted[c.m], c.u, "member %s", c.m)
	}
}

func TestGrantBatchCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	defineBatchQuotas(t, b)
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err := b.client.GrantBatch(ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1}})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, b.countRows(t, "usage"))
}

// readCommitted is the isolation of the tests' own transactions: they
// test lock waits, which REPEATABLE READ or SERIALIZABLE (the server's
// default_transaction_isolation in one CI pass) would turn into
// serialization failures of the test's own transaction.
