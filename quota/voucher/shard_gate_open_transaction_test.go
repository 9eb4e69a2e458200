package voucher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// A request handler claims a unit for alice in its transaction
// (ClaimTx) and, before it commits, a unit for the referrer bob with
// Claim. Meanwhile alice double-clicks: her second Claim
// takes the only place at the gate (3 shards: one claim in flight) and
// waits in the database for the handler's uncommitted claim row. Had bob's
// claim waited for that place, the three would wait for each other with
// nothing to detect it (found by breaker3); it waits at most 100ms, then
// takes a free shard.
func TestShardGateBlockedByDuplicateOfOpenTx(t *testing.T) {
	t.Parallel()
	for _, bound := range []int{0, -1} {
		t.Run(fmt.Sprint("bound ", bound), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 6)
			client, err := quota.New(b.pool, nil)
			voucherWith(t, client, &voucher.Config{ShardedClaimsInFlight: bound})
			require.NoError(t, err)
			_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 30, 3)
			require.NoError(t, err)
			// Warm the client's caches, as a running service has.
			warm, err := voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "warm"})
			require.NoError(t, err)
			require.True(t, warm.Claimed)

			tx, err := b.pool.BeginTx(b.ctx, readCommitted)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			held, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "p", Member: "alice"})
			require.NoError(t, err)
			require.True(t, held.Claimed)

			dupCtx, cancelDup := context.WithCancel(b.ctx)
			defer cancelDup()
			dup := make(chan error, 1)
			go func() {
				_, err := voucherOf(t, client).Claim(dupCtx, voucher.ClaimRequest{Campaign: "p", Member: "alice"})
				dup <- err
			}()
			b.WaitForLockWaits(t, 1) // alice's duplicate waits for tx

			// The handler, still in its transaction, claims for bob.
			ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
			defer cancel()
			start := time.Now()
			bob, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: "bob"})
			require.NoError(t, err, "bob's claim is stuck behind alice's duplicate (after %s) while shards with units are free", time.Since(start).Round(time.Millisecond))
			require.True(t, bob.Claimed)
			require.NoError(t, tx.Commit(b.ctx))
			require.NoError(t, <-dup)
		})
	}
}

// The same without duplicate clicks: two transactions hold the two shards
// of a pool (ClaimTx, still open), so a Claim waits in the
// database for one of them, as designed. The other transaction commits:
// its shard is free and has units. A new claim must not wait behind the
// first one for as long as the remaining transaction stays open (found by
// breaker3): it waits at most 100ms at the gate, then takes the free shard.
func TestShardGateBlockedBehindClaimWaitingForOpenTx(t *testing.T) {
	t.Parallel()
	for _, bound := range []int{0, -1} {
		t.Run(fmt.Sprint("bound ", bound), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 6)
			client, err := quota.New(b.pool, nil)
			voucherWith(t, client, &voucher.Config{ShardedClaimsInFlight: bound})
			require.NoError(t, err)
			_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 10, 2)
			require.NoError(t, err)
			warm, err := voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "warm"})
			require.NoError(t, err)
			require.True(t, warm.Claimed)

			txs := map[int32]func(){} // backend pid -> commit
			for i := range 2 {
				tx, err := b.pool.BeginTx(b.ctx, readCommitted)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(b.ctx) }()
				c, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "p", Member: fmt.Sprint("tx", i)})
				require.NoError(t, err)
				require.True(t, c.Claimed)
				var pid int32
				require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
				txs[pid] = func() { require.NoError(t, tx.Commit(b.ctx)) }
			}
			_, claimed := b.shardCounters(t, "p")
			require.Len(t, claimed, 2)

			waiterCtx, cancelWaiter := context.WithCancel(b.ctx)
			defer cancelWaiter()
			waiter := make(chan error, 1)
			go func() {
				_, err := voucherOf(t, client).Claim(waiterCtx, voucher.ClaimRequest{Campaign: "p", Member: "waiter"})
				waiter <- err
			}()
			b.WaitForLockWaits(t, 1)
			var blocker int32
			require.NoError(t, b.pool.QueryRow(b.ctx, `
				SELECT (pg_blocking_pids(pid))[1] FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&blocker))
			require.Contains(t, txs, blocker)
			for pid, commit := range txs {
				if pid != blocker {
					commit() // its shard is free again, with units
				}
			}

			ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
			defer cancel()
			c, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: "newcomer"})
			require.NoError(t, err, "a claim waits behind one that waits for an open transaction, while a shard with units is free")
			require.True(t, c.Claimed)
			cancelWaiter()
			<-waiter
		})
	}
}
