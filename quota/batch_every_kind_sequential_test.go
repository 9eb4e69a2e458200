package quota_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// GrantBatch decides requests of every kind in one call: rate, fixed,
// rolling, calendar, lifetime and grants against several quotas, repeated
// counters included. With the clock pinned, each outcome (Granted, Used,
// Remaining, RetryAfter, ResetAfter, DecidedAt, DeniedBy, Limits) equals
// the one Grant gives the same request, the requests run one after another
// in slice order for another member; the calendar requests' waits follow
// pgquota.grant_limits (0 when granted, time to the window's end, Never for
// an amount above the limit or a lifetime counter). A keyed request of a
// shaped kind gets its own ErrInvalidInput and writes nothing.
func TestGrantBatchEveryKindEqualsSequentialGrants(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.setClock(t, "2026-03-01 12:00:00+00")
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	b.define(t, quota.Definition{Name: "life", Window: quota.WindowNone, DefaultLimit: ptr(int64(3))})
	b.define(t, quota.Definition{Name: "rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(10)), Period: time.Minute, Burst: 4})
	b.define(t, quota.Definition{Name: "fixed", Window: quota.WindowFixed, DefaultLimit: ptr(int64(3)), Period: 10 * time.Minute})
	b.define(t, quota.Definition{Name: "roll", Window: quota.WindowRolling, DefaultLimit: ptr(int64(4)), Period: time.Hour})
	seq := func(member string) []quota.GrantRequest {
		return []quota.GrantRequest{
			{Quota: "rate", Member: member, Amount: 3},
			{Quota: "rate", Member: member, Amount: 2}, // denied: 1 left
			{Quota: "fixed", Member: member, Amount: 2},
			{Quota: "roll", Member: member, Amount: 3},
			{Quotas: []string{"roll", "rate"}, Member: member, Amount: 1}, // granted: both have 1
			{Quota: "rate", Member: member, Amount: 1},                    // denied: none left
			{Quota: "day", Member: member, Amount: 4},
			{Quotas: []string{"fixed", "day"}, Member: member, Amount: 1}, // granted: day at 5, fixed at 3
			{Quota: "day", Member: member, Amount: 1},                     // denied: to the window's end
			{Quota: "fixed", Member: member, Amount: 1},                   // denied
			{Quota: "life", Member: member, Amount: 3},
			{Quota: "life", Member: member, Amount: 1}, // denied: Never
			{Quota: "day", Member: member, Amount: 6},  // above the limit: Never
			{Quota: "roll", Member: member, Amount: 1, Limit: ptr(int64(9))},
			{Quota: "rate", Member: member, Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k"}}, // refused
			{Quota: "nope", Member: member, Amount: 1},
		}
	}
	outs, err := b.client.GrantBatch(b.ctx, seq("batch"))
	require.NoError(t, err)
	want := seq("alone")
	require.Len(t, outs, len(want))
	for i, req := range want {
		res, err := b.client.Grant(b.ctx, req)
		if err != nil {
			require.Error(t, outs[i].Err, "request %d", i)
			require.Equal(t, err.Error(), outs[i].Err.Error(), "request %d", i)
			continue
		}
		require.NoError(t, outs[i].Err, "request %d", i)
		got := outs[i].GrantResult
		require.Equal(t, "batch", got.Member)
		got.Member = "alone"
		if req.Quota == "day" || req.Quota == "life" {
			// Calendar requests on their own: Grant's single statement
			// reports its counter; the batch adds the waits.
			require.Equal(t, res.Granted, got.Granted, "request %d", i)
			require.Equal(t, res.Used, got.Used, "request %d", i)
			require.Equal(t, res.Remaining, got.Remaining, "request %d", i)
			require.Equal(t, res.WindowEnd, got.WindowEnd, "request %d", i)
			require.Equal(t, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), got.DecidedAt.UTC(), "request %d", i)
			continue
		}
		require.Equal(t, res, got, "request %d", i)
	}
	granted := []bool{true, false, true, true, true, false, true, true, false, false, true, false, false, true}
	for i, g := range granted {
		require.Equal(t, g, outs[i].Granted, "request %d", i)
	}
	require.Equal(t, "rate", outs[1].DeniedBy)
	require.Equal(t, 6*time.Second, outs[1].RetryAfter, "10/min: one unit each 6 s")
	require.Len(t, outs[4].Limits, 2)
	// Calendar waits, as pgquota.grant_limits gives them.
	require.Equal(t, time.Duration(0), outs[6].RetryAfter)
	require.Equal(t, 12*time.Hour, outs[6].ResetAfter)
	require.Equal(t, 12*time.Hour, outs[8].RetryAfter)
	require.Equal(t, quota.Never, outs[11].RetryAfter)
	require.Equal(t, quota.Never, outs[11].ResetAfter)
	require.Equal(t, quota.Never, outs[12].RetryAfter)
	require.Equal(t, 12*time.Hour, outs[12].ResetAfter)
	require.ErrorIs(t, outs[14].Err, quota.ErrInvalidInput)
	require.ErrorIs(t, outs[15].Err, quota.ErrQuotaNotFound)
	sum, _ := b.usageRows(t, "day", "batch")
	require.Equal(t, int64(5), sum)
}

// A grant against two quotas in a batch, denied by its second quota,
// leaves the first one's counter as it was; the calendar requests of the
// same counter around it are decided in slice order with it, and a request
// the batch refuses (a rolling limit above MaxRollingLimit) leaves no state
// row.
func TestGrantBatchMultiQuotaDeniedBySecondLeavesFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "a-day", Window: quota.WindowDay, DefaultLimit: ptr(int64(10))})
	b.define(t, quota.Definition{Name: "b-rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(1)), Period: time.Hour})
	b.define(t, quota.Definition{Name: "c-roll", Window: quota.WindowRolling, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	for _, coalesced := range []bool{false, true} {
		member := map[bool]string{false: "plain", true: "coalesced"}[coalesced]
		c := b.client
		if coalesced {
			c = b.coalescing(t, quota.Config{})
		}
		res, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "b-rate", Member: member, Amount: 1})
		require.NoError(t, err)
		require.True(t, res.Granted)
		outs, err := c.GrantBatch(b.ctx, []quota.GrantRequest{
			{Quota: "a-day", Member: member, Amount: 3},
			{Quotas: []string{"a-day", "b-rate"}, Member: member, Amount: 1},
			{Quota: "a-day", Member: member, Amount: 2},
			{Quota: "c-roll", Member: member, Amount: 1, Limit: ptr(int64(quota.MaxRollingLimit + 1))},
		})
		require.NoError(t, err)
		require.NoError(t, outs[0].Err)
		require.Equal(t, int64(3), outs[0].Used)
		require.NoError(t, outs[1].Err)
		require.False(t, outs[1].Granted)
		require.Equal(t, "b-rate", outs[1].DeniedBy)
		require.Len(t, outs[1].Limits, 2)
		require.True(t, outs[1].Limits[0].Fits, "a-day had room")
		require.Equal(t, int64(3), outs[1].Limits[0].Used, "a-day as it was")
		require.False(t, outs[1].Limits[1].Fits)
		require.NoError(t, outs[2].Err)
		require.Equal(t, int64(5), outs[2].Used)
		require.ErrorIs(t, outs[3].Err, quota.ErrInvalidInput)
		sum, rows := b.usageRows(t, "a-day", member)
		require.Equal(t, int64(5), sum, "the denied grant left a-day unchanged")
		require.Equal(t, int64(1), rows)
		require.Equal(t, int64(0), b.countWhere(t, "rolling_usage", "member = '"+member+"'"))
	}
}

// A batch locks its state rows in (quota, member) order before it decides
// its requests in slice order: while transaction A holds r1, batch B of
// [r2, r1] waits for r1 holding nothing, so A can still take r2 and
// commit (had B locked r2 first, A would wait for B and B for A: SQLSTATE
// 40P01). Both batches are then granted. Under REPEATABLE READ or
// SERIALIZABLE (CI's SERIALIZABLE pass) B's update of r1 after A committed
// fails with 40001 instead, never 40P01: B runs in RunInTx, which retries
// it, as a caller's transaction is retried.
func TestGrantBatchLocksInKeyOrderSoOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "r1", Window: quota.WindowRate, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	b.define(t, quota.Definition{Name: "r2", Window: quota.WindowFixed, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	grantIn := func(tx pgx.Tx, names ...string) {
		var reqs []quota.GrantRequest
		for _, n := range names {
			reqs = append(reqs, quota.GrantRequest{Quota: n, Member: "m", Amount: 1})
		}
		var outs []quota.BatchOutcome
		var err error
		if tx == nil {
			outs, err = b.client.GrantBatch(b.ctx, reqs)
		} else {
			outs, err = b.client.GrantBatchTx(b.ctx, tx, reqs)
		}
		require.NoError(t, err)
		for i, o := range outs {
			require.NoError(t, o.Err, "request %d", i)
			require.True(t, o.Granted, "request %d", i)
		}
	}
	// The rows exist, so that each batch only locks.
	grantIn(nil, "r1", "r2")

	txA, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = txA.Rollback(b.ctx) }()
	grantIn(txA, "r1")
	done := make(chan error, 1)
	go func() {
		done <- quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			outs, err := b.client.GrantBatchTx(b.ctx, tx, []quota.GrantRequest{
				{Quota: "r2", Member: "m", Amount: 1}, {Quota: "r1", Member: "m", Amount: 1},
			})
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "40P01" {
				// The deadlock this test is about: %v, so that RunInTx
				// does not retry it away.
				return fmt.Errorf("batch B deadlocked: %v", err)
			}
			if err == nil && (!outs[0].Granted || !outs[1].Granted) {
				err = fmt.Errorf("batch B: not granted: %+v", outs)
			}
			return err
		})
	}()
	b.waitForLockWait(t)
	grantIn(txA, "r2")
	require.NoError(t, txA.Commit(b.ctx))
	require.NoError(t, <-done)
	sum, _ := b.usageRows(t, "r2", "m")
	require.Equal(t, int64(3), sum)
}
