package lease

import (
	"context"
	"time"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// MinReapAge is the smallest ReapRequest.OlderThan accepted: a
// smaller one is almost certainly a unit mistake, and a lease row kept a
// while after it expired still tells `pgquota lease show` who held it last.
const MinReapAge = time.Minute

// ReapRequest says which lease rows Reap deletes.
type ReapRequest struct {
	// OlderThan is how long ago, by the database clock, a lease must have
	// expired (or been released) for its row to go: at least
	// MinReapAge. Required.
	OlderThan time.Duration
	// Fences also deletes, with each reaped lease row, the fence row of the
	// same name (the highest token seen for the resource the lease fences),
	// when all of these hold: nothing raised it above the lease's last
	// token (so no external token source, an etcd revision or a ZooKeeper
	// zxid, ever wrote there with a larger one); no write touched it within
	// OlderThan; no pgquota trigger names the resource (a table guarded by
	// fence.Client.GuardTable, whose writes are checked against the fence row
	// alone); and no fenced writer holds it at the moment.
	//
	// Set it only when every write to these resources is checked against
	// the lease of the resource's own name (fence.Client.WriteRow with Lease equal to
	// Resource, or the lab's fenced grant): such a write from a holder deposed long ago
	// finds no lease row held with its token and is rejected, as before.
	// A write checked against the fence row alone (fence.Client.WriteRow without
	// Lease, or with another lease) carrying an old token would be admitted
	// once the row is gone: the database no longer knows how high the
	// resource's tokens went. That is why fence rows are kept by default,
	// and why a fence row with no lease row of its name (a resource fenced
	// by an external token source only) is never deleted here: nothing
	// tells when its last holder stopped. Defaults to false.
	Fences bool
	// Limit bounds the lease rows deleted by this call; 0 means no bound.
	// Rows go in batches of a few thousand, one short statement each.
	Limit int
}

// Reaped is a lease row Reap deleted.
type Reaped struct {
	Name  string `json:"name"`
	Token int64  `json:"token"`
	// ExpiresAt is when the lease had expired or been released.
	ExpiresAt time.Time `json:"expires_at"`
	// FenceDeleted reports whether the fence row of the same name went too
	// (only with ReapRequest.Fences).
	FenceDeleted bool `json:"fence_deleted"`
}

// Reap deletes lease rows that expired (or were released) more than
// req.OlderThan ago by the database clock, and with req.Fences the fence
// rows that go with them, and returns what it deleted, by name within
// each batch. Both tables otherwise keep a row for every name ever
// used. Run it periodically (`pgquota lease reap --older-than 24h` from
// cron, say).
//
// By default it never weakens the guarantee that a stale holder never
// writes: a lease row alone can go, because a write checked against the
// lease then finds no row held with its token (ErrLost), the fence row
// keeps the highest token for writes checked against it alone, and tokens
// come from one sequence, so the next acquisition of the name gets a token
// larger than the reaped one. req.Fences says when fence rows may go too.
//
// It waits for nobody: a lease row locked by a fenced write or an acquirer,
// a name an acquirer is taking (its transaction-level advisory lock), and a
// fence row locked by a writer are skipped and left for the next run (see
// LeaseReap in queries/lease_admin.sql).
//
// Renew and Release of a reaped lease return ErrLost ("it does not
// exist"), and Get returns ErrNotFound.
//
// Errors: *quota.InputError when req.OlderThan is below MinReapAge or
// req.Limit is negative; the context's error; quota.ErrSchemaMissing; database
// errors; quota.ErrOutcomeUnknown when a batch's statement was sent and no reply
// said how it ended (its rows may be deleted: list the leases, or reap
// again, which is harmless). Rows deleted by earlier batches stay deleted;
// the returned slice lists them.
func (c *Client) Reap(ctx context.Context, req ReapRequest) ([]Reaped, error) {
	switch {
	case req.OlderThan < 0:
		return nil, core.Invalid("older than", "must not be negative, got %s", req.OlderThan)
	case req.OlderThan < MinReapAge:
		return nil, core.Invalid("older than", "must be at least %s, got %s", MinReapAge, req.OlderThan)
	case req.Limit < 0:
		return nil, core.Invalid("limit", "must not be negative, got %d", req.Limit)
	}
	var out []Reaped
	for {
		batch := core.ReapBatch
		if req.Limit > 0 {
			batch = min(batch, req.Limit-len(out))
		}
		// One statement, its own implicit transaction: run again whole on
		// a serialization failure or deadlock.
		rows, err := core.Retry(ctx, c.core.Policy, func() ([]db.LeaseReapRow, error) {
			return c.core.Queries.LeaseReap(ctx, c.core.DB.Pool, db.LeaseReapParams{
				OlderThanUs: req.OlderThan.Microseconds(), BatchSize: int32(batch), Fences: req.Fences,
			})
		})
		if err != nil {
			return out, core.DBError("reap leases", err)
		}
		for _, r := range rows {
			out = append(out, Reaped{Name: r.Name, Token: r.Token, ExpiresAt: core.TimeFromPG(r.ExpiresAt), FenceDeleted: r.FenceDeleted})
		}
		if len(rows) < batch || (req.Limit > 0 && len(out) >= req.Limit) {
			return out, nil
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
	}
}
