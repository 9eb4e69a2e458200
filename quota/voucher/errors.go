package voucher

import "github.com/pgquota/pgquota/internal/core"

// Sentinel errors of voucher campaigns. Test for them with errors.Is.
var (
	// ErrCampaignNotFound is returned by Claim, ClaimTx and Campaign when
	// no campaign of that name exists.
	ErrCampaignNotFound = core.ErrCampaignNotFound

	// ErrCampaignExists is returned by CreateCampaign and CreateCampaignTx
	// when the campaign already exists with another total or kind, by
	// CreateShardedCampaign and CreateShardedCampaignTx when it exists with
	// another total, number of shards or kind, and by ImportCodes and
	// ImportCodesTx when the campaign exists as a counted or sharded pool.
	// A repeated create with the same total (and shards) is not an error.
	ErrCampaignExists = core.ErrCampaignExists
)
