package lease

import (
	"context"
	"time"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Limits of List.
const (
	// DefaultListLimit is the number of leases List returns when
	// Filter.Limit is 0.
	DefaultListLimit = 100
	// MaxListLimit is the largest Filter.Limit accepted.
	MaxListLimit = 10000
)

// Filter selects the leases List lists. The zero value lists the
// first DefaultListLimit leases, held or not.
type Filter struct {
	// Prefix keeps the leases whose name starts with it (byte for byte, no
	// pattern characters). Empty keeps all. At most quota.MaxNameBytes bytes, no
	// control characters.
	Prefix string
	// HeldOnly keeps the leases held by the database clock at the
	// statement's instant; otherwise expired and released rows (kept until
	// Reap deletes them) are listed too. Defaults to false.
	HeldOnly bool
	// Limit is the most leases returned: 1 to MaxListLimit. Defaults
	// (0) to DefaultListLimit.
	Limit int
	// After continues a listing: only names sorting after it (in the
	// database's collation) are returned. Pass the last name of the
	// previous page. Defaults to "" (from the start).
	After string
}

// List lists lease rows ordered by name, with their payloads, as one
// statement reads them: Held, Remaining and the payload are judged at the
// statement's database clock reading (Lease.DBNow). A page shorter than
// the limit is the last one.
//
// Errors: *quota.InputError for a prefix or After with control characters or
// longer than quota.MaxNameBytes, or a Limit outside 0..MaxListLimit;
// quota.ErrSchemaMissing; database errors.
func (c *Client) List(ctx context.Context, f Filter) ([]Lease, error) {
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
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return nil, core.Invalid("limit", "must be between 1 and %d (0 for %d), got %d", MaxListLimit, DefaultListLimit, f.Limit)
	case f.Limit == 0:
		f.Limit = DefaultListLimit
	}
	sent := time.Now()
	rows, err := c.core.Queries.LeaseList(ctx, c.core.Pool, db.LeaseListParams{
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
