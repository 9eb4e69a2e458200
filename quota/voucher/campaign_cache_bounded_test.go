package voucher_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// TestShardedClaimsCampaignCacheBounded claims from 3 times as many
// sharded campaigns as a Client's per-campaign caches may hold (shrunk to 8
// for the test): the caches never hold more than their bound, and a
// campaign evicted from them claims exactly as before (a member's second
// claim is a repeat of the first unit, a new member gets the next unit, and
// a sold-out pool says so).
func TestShardedClaimsCampaignCacheBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const bound, campaigns = 8, 24
	c, err := quota.New(b.pool, testConfig(t, nil))
	require.NoError(t, err)
	voucher.SetCampaignCacheSize(voucherOf(t, c), bound)
	// The campaigns in one statement each: 2 units in 2 shards.
	_, err = b.owner.Exec(b.ctx, `
		WITH p AS (
			INSERT INTO pgquota.voucher_pool (campaign, kind, total)
			SELECT 'c' || i, 'sharded', 2 FROM generate_series(1, $1::int) i
			RETURNING campaign
		)
		INSERT INTO pgquota.voucher_shard (campaign, shard, base, total)
		SELECT p.campaign, s, s, 1 FROM p, generate_series(0, 1) s`, campaigns)
	require.NoError(t, err)

	for round := range 2 {
		for i := 1; i <= campaigns; i++ {
			camp := fmt.Sprint("c", i)
			first, err := voucherOf(t, c).Claim(b.ctx, voucher.ClaimRequest{Campaign: camp, Member: "alice"})
			require.NoError(t, err, "round %d %s", round, camp)
			require.True(t, first.Claimed)
			require.Equal(t, round == 1, first.Repeat, "round %d %s", round, camp)
			counts, gates := voucher.CampaignCacheLens(voucherOf(t, c))
			require.LessOrEqual(t, counts, bound)
			require.LessOrEqual(t, gates, bound)
		}
	}
	for i := 1; i <= campaigns; i++ {
		camp := fmt.Sprint("c", i)
		second, err := voucherOf(t, c).Claim(b.ctx, voucher.ClaimRequest{Campaign: camp, Member: "bob"})
		require.NoError(t, err)
		require.True(t, second.Claimed)
		require.False(t, second.Repeat)
		none, err := voucherOf(t, c).Claim(b.ctx, voucher.ClaimRequest{Campaign: camp, Member: "carol"})
		require.NoError(t, err)
		require.False(t, none.Claimed, "%s: 2 units, both claimed", camp)
	}
	counts, gates := voucher.CampaignCacheLens(voucherOf(t, c))
	require.Equal(t, bound, counts, "the cache is full, not larger")
	require.Equal(t, bound, gates)
	var claims int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.voucher_claim`).Scan(&claims))
	require.Equal(t, int64(2*campaigns), claims)
}
