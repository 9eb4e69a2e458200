package voucher

import "time"

// Test hooks, compiled into the package's tests only.

// SetShardGateMaxWait makes c's claims on sharded pools wait up to d for
// a place at the gate before they go ahead without one.
func SetShardGateMaxWait(c *Client, d time.Duration) {
	c.testShardGateMaxWait = d
}

// CampaignCacheLens returns how many campaigns c's shard-count and
// shard-gate caches hold.
func CampaignCacheLens(c *Client) (counts, gates int) {
	return c.shardCounts.Len(), c.shardGates.Len()
}

// CampaignCacheSize is the bound of each per-campaign cache.
const CampaignCacheSize = campaignCacheSize

// SetCampaignCacheSize bounds c's per-campaign caches to n campaigns. Set it
// before the first claim.
func SetCampaignCacheSize(c *Client, n int) {
	c.shardCounts.size, c.shardGates.size = n, n
}
