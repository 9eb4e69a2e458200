package voucher

import (
	"time"

	"github.com/pgquota/pgquota/internal/clientcore"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// Config holds a voucher Client's settings. The zero value (or a nil
// *Config) is ready to use.
type Config struct {
	// CodeClaimWait bounds how long Claim keeps trying while unclaimed
	// codes exist but every one of them is locked by another claimer that
	// has not committed yet (it may still roll back, so the campaign is not
	// sold out). The caller's context bounds it too. Defaults to 5s.
	CodeClaimWait time.Duration

	// ShardedClaimsInFlight bounds, per sharded pool, how many of this
	// client's Claim calls run a claim statement at once; the others
	// wait in the client, in no particular order, bounded by their contexts
	// and by 100ms: a call that waited that long goes ahead without a
	// place, so a claim that waits in the database for a transaction of
	// yours (ClaimTx, not committed yet) never holds the others up
	// for longer, nor closes a wait cycle with that transaction.
	// Zero means half the pool's shards (at least 1), which keeps FOR UPDATE
	// SKIP LOCKED finding an unlocked shard instead of queueing claims in
	// the shards' row locks, where many waiting sessions cost the server
	// more than they add (on a 2-core machine at 64 clients, a 32-shard pool
	// claimed about 1.7 times as fast with the bound as without). A negative
	// value removes the bound. ClaimTx, keyed claims (ClaimRequest.Idempotency)
	// and counted pools are never bounded.
	ShardedClaimsInFlight int
}

// Client creates voucher campaigns and claims from them. It is safe for
// concurrent use by many goroutines.
type Client struct {
	core *core.Core
	cfg  Config

	// shardCounts remembers the sharded pools this client claimed from and
	// their number of shards (every claim reports it), by campaign, for the
	// campaignCacheSize campaigns used last (cache.go): a claim on one
	// passes the shard gate (claim.go, shard.go).
	shardCounts boundedMap
	// shardGates holds, per sharded campaign, the channel that bounds this
	// client's claims in flight (shardGate), for as many campaigns.
	shardGates boundedMap
	// testShardGateMaxWait replaces shardGateMaxWait when not zero (tests).
	testShardGateMaxWait time.Duration
}

// New returns a voucher client on c's pool, with c's settings (retries,
// metrics) and cfg (nil for the defaults). It does not touch the database.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) when c is nil or a cfg
// field is negative where it may not be (Config.CodeClaimWait).
func New(c *quota.Client, cfg *Config) (*Client, error) {
	k, err := clientcore.Of(c)
	if err != nil {
		return nil, err
	}
	v := &Client{core: k}
	if cfg != nil {
		v.cfg = *cfg
	}
	if v.cfg.CodeClaimWait < 0 {
		return nil, core.Invalid("Config.CodeClaimWait", "must not be negative, got %s", v.cfg.CodeClaimWait)
	}
	if v.cfg.CodeClaimWait == 0 {
		v.cfg.CodeClaimWait = 5 * time.Second
	}
	return v, nil
}
