package voucher_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// claimsInFlight measures how many of client's Claim calls on
// campaign run their statement at once: a transaction claims for k members
// and stays open, then k duplicates of those claims are started; each one
// admitted by the client waits in the database for the transaction's claim
// rows. It returns the number of lock waits seen, and cleans up. The
// members are named prefix0..prefixk-1: a duplicate whose context ended
// while it waited in the database still runs there, and claims the unit
// once the transaction rolls back.
func claimsInFlight(t *testing.T, b *testBundle, client *quota.Client, campaign, prefix string, k int) int {
	t.Helper()
	tx, err := b.pool.BeginTx(b.ctx, readCommitted)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	for i := range k {
		c, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: campaign, Member: fmt.Sprint(prefix, i)})
		require.NoError(t, err)
		require.True(t, c.Claimed)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: campaign, Member: fmt.Sprint(prefix, i)})
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	n := 0
	for time.Now().Before(deadline) {
		if n = b.LockWaits(t); n >= k {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	require.NoError(t, tx.Rollback(b.ctx))
	b.Settle(t)
	return n
}

// recreateDrop drops a campaign (its shards and claims cascade) as an operator
// would.
func (b *testBundle) recreateDrop(t *testing.T, campaign string) {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, `DELETE FROM pgquota.voucher_pool WHERE campaign = $1`, campaign)
	require.NoError(t, err)
}

// A campaign is dropped and created again under the same name with another
// number of shards, through a counted pool in between, while the client is
// in use. The client's gate follows the new pool: grown from 2 to 16
// shards, 8 claims in flight; shrunk from 16 to 2, 1 (breaker3 found the
// gate keeping the first pool's capacity forever). A fresh client gets the
// same bound for the same pool.
func TestShardGateCapacityStaleAfterRecreate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		from, to  int
		probe     int // duplicates started
		wantLocks int // half the new pool's shards, at most probe
	}{
		{"grown 2 to 16", 2, 16, 4, 4},
		{"shrunk 16 to 2", 16, 2, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 10)
			client := b.client // default bound: half the shards
			// Claims wait at the gate for as long as the measurement takes,
			// instead of going ahead after 100ms.
			voucher.SetShardGateMaxWait(voucherOf(t, client), time.Hour)
			_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 100, tc.from)
			require.NoError(t, err)
			c, err := voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "first"})
			require.NoError(t, err)
			require.True(t, c.Claimed)

			// Dropped, briefly a counted pool, then sharded again.
			b.recreateDrop(t, "p")
			_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "p", 100)
			require.NoError(t, err)
			c, err = voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "counted"})
			require.NoError(t, err)
			require.True(t, c.Claimed)
			b.recreateDrop(t, "p")
			p, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 100, tc.to)
			require.NoError(t, err)
			require.Equal(t, tc.to, p.Shards)
			c, err = voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "sharded again"})
			require.NoError(t, err)
			require.True(t, c.Claimed)

			fresh, err := quota.New(b.pool, nil)
			require.NoError(t, err)
			voucher.SetShardGateMaxWait(voucherOf(t, fresh), time.Hour)
			c, err = voucherOf(t, fresh).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "fresh"})
			require.NoError(t, err)
			require.True(t, c.Claimed)
			require.Equal(t, tc.wantLocks, claimsInFlight(t, b, fresh, "p", "fresh-", tc.probe), "a fresh client's bound")

			require.Equal(t, tc.wantLocks, claimsInFlight(t, b, client, "p", "old-", tc.probe),
				"the client that knew the old pool bounds the new pool of %d shards by the old pool's %d", tc.to, tc.from)
		})
	}
}
