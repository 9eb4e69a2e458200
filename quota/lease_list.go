package quota

import (
	"context"
	"time"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Limits of Leases.
const (
	// DefaultLeaseListLimit is the number of leases Leases returns when
	// LeaseFilter.Limit is 0.
	DefaultLeaseListLimit = 100
	// MaxLeaseListLimit is the largest LeaseFilter.Limit accepted.
	MaxLeaseListLimit = 10000
)

// LeaseFilter selects the leases Leases lists. The zero value lists the
// first DefaultLeaseListLimit leases, held or not.
type LeaseFilter struct {
	// Prefix keeps the leases whose name starts with it (byte for byte, no
	// pattern characters). Empty keeps all. At most MaxNameBytes bytes, no
	// control characters.
	Prefix string
	// HeldOnly keeps the leases held by the database clock at the
	// statement's instant; otherwise expired and released rows (kept until
	// ReapLeases deletes them) are listed too. Defaults to false.
	HeldOnly bool
	// Limit is the most leases returned: 1 to MaxLeaseListLimit. Defaults
	// (0) to DefaultLeaseListLimit.
	Limit int
	// After continues a listing: only names sorting after it (in the
	// database's collation) are returned. Pass the last name of the
	// previous page. Defaults to "" (from the start).
	After string
}

// Leases lists lease rows ordered by name, with their payloads, as one
// statement reads them: Held, Remaining and the payload are judged at the
// statement's database clock reading (Lease.DBNow). A page shorter than
// the limit is the last one.
//
// Errors: *InputError for a prefix or After with control characters or
// longer than MaxNameBytes, or a Limit outside 0..MaxLeaseListLimit;
// ErrSchemaMissing; database errors.
func (c *Client) Leases(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	if f.Prefix != "" {
		if err := core.CheckName("prefix", f.Prefix); err != nil {
			return nil, err
		}
	}
	if f.After != "" {
		if err := core.CheckName("after", f.After); err != nil {
			return nil, err
		}
	}
	switch {
	case f.Limit < 0 || f.Limit > MaxLeaseListLimit:
		return nil, core.Invalid("limit", "must be between 1 and %d (0 for %d), got %d", MaxLeaseListLimit, DefaultLeaseListLimit, f.Limit)
	case f.Limit == 0:
		f.Limit = DefaultLeaseListLimit
	}
	sent := time.Now()
	rows, err := c.queries.LeaseList(ctx, c.pool, db.LeaseListParams{
		Prefix: f.Prefix, After: f.After, HeldOnly: f.HeldOnly, MaxRows: int32(f.Limit),
	})
	if err != nil {
		return nil, core.DBError("list leases", err)
	}
	out := make([]Lease, len(rows))
	for i, r := range rows {
		out[i] = leaseFrom(db.PgquotaLease{
			Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
			AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
		}, r.DbNow, sent)
		out[i].Payload = r.Payload
	}
	return out, nil
}
