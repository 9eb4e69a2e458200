package quota

import (
	"context"
)

// Lease tokens are (epoch << LeaseTokenEpochShift) + n: n comes from one
// sequence, below 2^40, and the epoch is the server's WAL timeline plus an
// offset recorded in pgquota.lease_epoch. The timeline grows by one at each
// promotion of a standby, so a token issued after a failover is larger than
// every token issued before it, also those the standby never received
// (ZooKeeper's zxid carries its leader epoch in the high 32 bits the same
// way). See migrations/00007_token_epoch.sql.
const (
	// LeaseTokenEpochShift is the bit position of a token's epoch: a
	// token's epoch is token >> LeaseTokenEpochShift.
	LeaseTokenEpochShift = 40
	// MaxLeaseEpoch is the highest epoch a token can carry, so that tokens
	// stay positive bigints.
	MaxLeaseEpoch = 1<<(63-LeaseTokenEpochShift) - 1
)

// LeaseEpoch describes the epoch lease tokens are issued in.
type LeaseEpoch struct {
	// Epoch is the epoch of the next token issued (token >> 40): the
	// timeline plus Offset, or above Recorded on a cluster other than the
	// one the epoch was recorded on (a restored dump). On a standby, the
	// recorded epoch.
	Epoch int64 `json:"epoch"`
	// Timeline is the server's WAL insert timeline; 0 on a standby.
	Timeline int64 `json:"timeline"`
	// Offset is the recorded number added to the timeline.
	Offset int64 `json:"timeline_offset"`
	// Recorded is the highest epoch recorded: tokens were issued in it.
	Recorded int64 `json:"recorded_epoch"`
	// Ceiling is at least every token issued so far, also by a former
	// primary in an earlier epoch that this server never received: a
	// token above it was never issued (pgquota.lease_token_ceiling()).
	Ceiling int64 `json:"ceiling"`
}

// LeaseEpoch returns the epoch lease tokens are issued in now.
//
// Errors: ErrSchemaMissing; database errors.
func (c *Client) LeaseEpoch(ctx context.Context) (LeaseEpoch, error) {
	r, err := c.queries.LeaseEpochGet(ctx, c.db)
	if err != nil {
		return LeaseEpoch{}, dbError("read lease epoch", err)
	}
	return LeaseEpoch{Epoch: r.Epoch, Timeline: r.Timeline, Offset: r.TimelineOffset, Recorded: r.RecordedEpoch, Ceiling: r.Ceiling}, nil
}

// BumpLeaseEpoch raises the epoch of the tokens issued from now on to at
// least minEpoch (0 for no minimum) and at least one above the current
// epoch, and returns the epoch after the call. Tokens issued before stay
// valid; every later token is larger than every earlier one, also than
// tokens a source cluster issued after the dump or snapshot this database
// was restored from, once the epoch exceeds theirs. pgquota raises the
// epoch by itself on promotion and when a database moves to another
// cluster (a new system identifier: pg_dump/pg_restore, pg_upgrade); bump
// it by hand when the source kept issuing tokens in later epochs after the
// dump, or after restoring a file-system snapshot of the same cluster
// without a new timeline. Run it on the primary and let it reach the
// standbys before a failover: a standby promoted without it issues tokens
// in its own, lower epoch.
//
// Errors: *InputError when minEpoch is negative or above MaxLeaseEpoch;
// ErrSchemaMissing; database errors (SQLSTATE 25006 on a standby, 22003
// when the epoch would pass MaxLeaseEpoch).
func (c *Client) BumpLeaseEpoch(ctx context.Context, minEpoch int64) (LeaseEpoch, error) {
	if minEpoch < 0 || minEpoch > MaxLeaseEpoch {
		return LeaseEpoch{}, inputError("minimum epoch", "must be between 0 and %d, got %d", int64(MaxLeaseEpoch), minEpoch)
	}
	if _, err := c.queries.LeaseEpochBump(ctx, c.db, minEpoch); err != nil {
		return LeaseEpoch{}, dbError("bump lease epoch", err)
	}
	return c.LeaseEpoch(ctx)
}
