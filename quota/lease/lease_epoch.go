package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// Lease tokens are (epoch << TokenEpochShift) + n: n comes from one
// sequence, below 2^40, and the epoch is the server's WAL timeline plus an
// offset recorded in pgquota.lease_epoch. The timeline grows by one at each
// promotion of a standby, so a token issued after a failover is larger than
// every token issued before it, also those the standby never received
// (ZooKeeper's zxid carries its leader epoch in the high 32 bits the same
// way). See migrations/00007_token_epoch.sql.
const (
	// TokenEpochShift is the bit position of a token's epoch: a
	// token's epoch is token >> TokenEpochShift.
	TokenEpochShift = 40
	// MaxEpoch is the highest epoch a token can carry, so that tokens
	// stay positive bigints.
	MaxEpoch = 1<<(63-TokenEpochShift) - 1
)

// Epoch describes the epoch lease tokens are issued in.
type Epoch struct {
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
	// Pending is the epoch of a bump prepared but not raised (0 for none):
	// the primary that prepared it keeps its epoch, and a standby promoted
	// after receiving it issues tokens above it.
	Pending int64 `json:"pending_epoch"`
	// Standbys lists, after BumpEpoch, the standbys the primary knew
	// and whether each confirmed the bump; empty otherwise.
	Standbys []EpochStandby `json:"standbys,omitempty"`
}

// EpochStandby is one standby the primary knows, as BumpEpoch
// saw it: a walsender of pg_stat_replication (a streaming standby) or an
// inactive physical replication slot (a standby configured with a slot and
// disconnected now).
type EpochStandby struct {
	// Name is the standby's application_name and address, "pid N" when it
	// has no name, or "slot NAME" for a disconnected slot.
	Name string `json:"name"`
	// State is pg_stat_replication's state (streaming, catchup, startup,
	// stopping) or "disconnected".
	State string `json:"state"`
	// FlushedLSN is the WAL position the standby has flushed (a slot's
	// restart_lsn); empty when the role may not read it (PostgreSQL shows
	// it to superusers and members of pg_read_all_stats only).
	FlushedLSN string `json:"flushed_lsn"`
	// Confirmed reports whether it has flushed the bump's WAL: a promotion
	// replays all flushed WAL, so once promoted it issues tokens above the
	// new epoch.
	Confirmed bool `json:"confirmed"`
}

// Epoch returns the epoch lease tokens are issued in now.
//
// Errors: quota.ErrSchemaMissing; database errors.
func (c *Client) Epoch(ctx context.Context) (Epoch, error) {
	r, err := c.core.Queries.LeaseEpochGet(ctx, c.core.DB)
	if err != nil {
		return Epoch{}, core.DBError("read lease epoch", err)
	}
	return Epoch{Epoch: r.Epoch, Timeline: r.Timeline, Offset: r.TimelineOffset, Recorded: r.RecordedEpoch,
		Ceiling: r.Ceiling, Pending: r.PendingEpoch}, nil
}

// DefaultBumpTimeout is how long BumpEpoch waits for the standbys
// when BumpEpochRequest.Timeout is 0.
const DefaultBumpTimeout = 30 * time.Second

// BumpEpochRequest is the argument of BumpEpoch.
type BumpEpochRequest struct {
	// MinEpoch is the least epoch to raise to (0 for none): the epoch
	// becomes max(MinEpoch, current epoch + 1). At most MaxEpoch.
	MinEpoch int64
	// Timeout bounds the wait for the standbys to confirm the bump; 0 for
	// DefaultBumpTimeout. Not negative.
	Timeout time.Duration
	// Standbys is the least number of standbys that must confirm (every
	// standby the primary sees must confirm in any case). The primary sees
	// the standbys connected to it and those with a physical replication
	// slot; a standby that is disconnected and has no slot is invisible to
	// it (so is a cascading standby, fed by another standby), so name here
	// how many standbys the deployment runs. 0: the standbys the primary
	// sees, and at least one unless NoStandbys. Not negative.
	Standbys int
	// NoStandbys states that the deployment runs no standby: a primary that
	// sees none raises the epoch at once. Without it (and with Standbys 0)
	// a primary that sees no standby refuses, since it cannot tell a
	// deployment without standbys from one whose standby is cut off.
	NoStandbys bool
	// Unconfirmed raises the epoch even when a standby has not confirmed
	// it within Timeout (or fewer than Standbys did). The risk: a standby
	// that missed the bump and is promoted issues tokens in timeline + its
	// own offset, which can be at or below the bumped epoch, so its tokens
	// can be below tokens the old primary issued after the bump, and a
	// deposed holder's writes can land. Use it only for a standby that will
	// never be promoted, or one rebuilt from the primary afterwards.
	Unconfirmed bool
}

// ErrEpochUnconfirmed is returned by BumpEpoch, wrapped in a
// *EpochUnconfirmedError, when a standby the primary knows has not
// confirmed the bump within the timeout (or fewer standbys than required
// did). The epoch of the tokens is then unchanged.
var ErrEpochUnconfirmed = errors.New("pgquota: lease epoch bump not confirmed by every standby")

// EpochUnconfirmedError says which standbys did not confirm a bump.
// It wraps ErrEpochUnconfirmed.
type EpochUnconfirmedError struct {
	// Epoch is the epoch the bump prepared; tokens are still issued in the
	// old one.
	Epoch int64
	// LSN is the WAL position a standby must flush to confirm it.
	LSN string
	// Standbys lists every standby the primary knew at the end of the wait.
	Standbys []EpochStandby
	// Required is the least number of standbys that had to confirm:
	// BumpEpochRequest.Standbys, or 1 when it was 0 without
	// NoStandbys.
	Required int
	// Timeout is how long it waited.
	Timeout time.Duration
}

func (e *EpochUnconfirmedError) Error() string {
	var missing []string
	confirmed, unreadable := 0, false
	for _, s := range e.Standbys {
		if s.Confirmed {
			confirmed++
			continue
		}
		unreadable = unreadable || s.FlushedLSN == ""
		missing = append(missing, fmt.Sprintf("%s (%s, flushed %s)", s.Name, s.State, orNone(s.FlushedLSN)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pgquota: lease epoch not raised to %d: after %s ", e.Epoch, e.Timeout)
	if len(missing) > 0 {
		fmt.Fprintf(&b, "standby %s has not flushed WAL up to %s", strings.Join(missing, ", "), e.LSN)
	} else if len(e.Standbys) == 0 {
		b.WriteString("the primary sees no standby (a standby that is disconnected and has no replication slot is invisible to it); " +
			"state that none runs with --no-standbys (BumpEpochRequest.NoStandbys), or how many run with --standbys N")
	} else {
		fmt.Fprintf(&b, "%d of the %d standbys required confirmed", confirmed, e.Required)
	}
	b.WriteString("; a standby promoted without the bump would issue tokens below the primary's")
	if unreadable {
		b.WriteString(" (a standby's position is unreadable: grant pg_read_all_stats to the role)")
	}
	b.WriteString("; wait for it and retry, or raise it anyway with --unconfirmed (BumpEpochRequest.Unconfirmed)")
	return b.String()
}

// Unwrap returns ErrEpochUnconfirmed.
func (e *EpochUnconfirmedError) Unwrap() error { return ErrEpochUnconfirmed }

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// BumpEpoch raises the epoch of the tokens issued from now on to at
// least req.MinEpoch and at least one above the current epoch, once every
// standby has it, and returns the epoch after the call with the standbys
// it saw. Tokens issued before stay valid; every later token is larger
// than every earlier one, also than tokens a source cluster issued after
// the dump or snapshot this database was restored from, once the epoch
// exceeds theirs.
//
// It runs in three steps (migrations/00019_epoch_floor.sql): it records
// the new epoch as pending and commits (tokens keep their epoch); it waits
// until every standby the primary knows (pg_stat_replication's walsenders,
// inactive physical replication slots), and at least req.Standbys of
// them, has flushed that commit (a promoted standby replays all it has
// flushed, and issues tokens above a pending epoch); then it raises the
// epoch. When a standby does not confirm within req.Timeout, or fewer
// than req.Standbys did, or the primary sees no standby and
// req.NoStandbys is not set, it raises nothing and returns
// *EpochUnconfirmedError, unless req.Unconfirmed. Reading the standbys' positions needs a superuser or a
// member of pg_read_all_stats; a standby whose position the role cannot
// read never confirms.
//
// pgquota raises the epoch by itself on promotion and when a database
// moves to another cluster (a new system identifier: pg_dump/pg_restore,
// pg_upgrade); bump it by hand with MinEpoch above the source's epoch
// (the source's `pgquota lease epoch`) when a restored copy (a base backup
// or file-system snapshot started as its own cluster, a dump whose source
// went on bumping) must issue tokens above the source's.
//
// Errors: *quota.InputError when MinEpoch is negative or above MaxEpoch, or
// Timeout or Standbys is negative; *EpochUnconfirmedError
// (ErrEpochUnconfirmed); quota.ErrSchemaMissing; database errors (SQLSTATE
// 25006 on a standby, 22003 when the epoch would pass MaxEpoch);
// ctx's error when it ends during the wait (nothing raised).
func (c *Client) BumpEpoch(ctx context.Context, req BumpEpochRequest) (Epoch, error) {
	if req.MinEpoch < 0 || req.MinEpoch > MaxEpoch {
		return Epoch{}, core.Invalid("minimum epoch", "must be between 0 and %d, got %d", int64(MaxEpoch), req.MinEpoch)
	}
	if req.Timeout < 0 {
		return Epoch{}, core.Invalid("timeout", "must not be negative, got %s", req.Timeout)
	}
	if req.Standbys < 0 {
		return Epoch{}, core.Invalid("standbys", "must not be negative, got %d", req.Standbys)
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = DefaultBumpTimeout
	}
	epoch, err := c.core.Queries.LeaseEpochPrepare(ctx, c.core.DB, req.MinEpoch)
	if err != nil {
		return Epoch{}, core.DBError("bump lease epoch", err)
	}
	lsn, err := c.core.Queries.CurrentWALLSN(ctx, c.core.DB.Reads())
	if err != nil {
		return Epoch{}, core.DBError("bump lease epoch: read WAL position", err)
	}
	required := req.Standbys
	if required == 0 && !req.NoStandbys {
		required = 1
	}
	standbys, err := c.awaitStandbys(ctx, lsn, required, timeout)
	if err != nil {
		return Epoch{}, err
	}
	if !standbysConfirmed(standbys, required) && !req.Unconfirmed {
		return Epoch{}, &EpochUnconfirmedError{Epoch: epoch, LSN: lsn, Standbys: standbys, Required: required, Timeout: timeout}
	}
	if _, err := c.core.Queries.LeaseEpochRaise(ctx, c.core.DB, epoch); err != nil {
		return Epoch{}, core.DBError("bump lease epoch", err)
	}
	e, err := c.Epoch(ctx)
	e.Standbys = standbys
	return e, err
}

// awaitStandbys polls the standbys until every one has flushed lsn and at
// least required did, or timeout passes; it returns the last listing.
func (c *Client) awaitStandbys(ctx context.Context, lsn string, required int, timeout time.Duration) ([]EpochStandby, error) {
	deadline := time.Now().Add(timeout)
	for {
		rows, err := c.core.Queries.LeaseEpochStandbys(ctx, c.core.DB.Reads(), lsn)
		if err != nil {
			return nil, core.DBError("bump lease epoch: read standbys", err)
		}
		standbys := make([]EpochStandby, len(rows))
		for i, r := range rows {
			standbys[i] = EpochStandby{Name: r.Name, State: r.State, FlushedLSN: r.FlushedLsn, Confirmed: r.Confirmed}
		}
		if standbysConfirmed(standbys, required) || !time.Now().Before(deadline) {
			return standbys, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pgquota: bump lease epoch: waiting for standbys: %w", ctx.Err())
		case <-time.After(min(50*time.Millisecond, time.Until(deadline))):
		}
	}
}

func standbysConfirmed(standbys []EpochStandby, required int) bool {
	n := 0
	for _, s := range standbys {
		if !s.Confirmed {
			return false
		}
		n++
	}
	return n >= required
}
