package lease

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/dbutil"
)

// A lease's payload is data its holder stores with it, as the DynamoDB lock
// client stores data with a lock: a leader's address for the followers to
// find, a job's progress for the next holder to read. It belongs to one
// acquisition: stored with the token that wrote it, it counts only while
// that token holds the row, so a new holder starts without its
// predecessor's payload (migrations/00008_lease_admin.sql).

// MaxPayloadBytes is the largest lease payload accepted, in bytes.
const MaxPayloadBytes = 64 << 10

func checkPayload(p string) error {
	switch {
	case len(p) > MaxPayloadBytes:
		return core.Invalid("payload", "is %d bytes long, the limit is %d", len(p), MaxPayloadBytes)
	case !utf8.ValidString(p):
		return core.Invalid("payload", "is not valid UTF-8")
	case strings.IndexByte(p, 0) >= 0:
		return core.Invalid("payload", "must not contain NUL")
	}
	return nil
}

// acquireWithPayload takes the lease and stores req.Payload with it in one
// transaction: x's when x is one, else a transaction of its own on the
// pool, so nobody ever sees the new acquisition without its payload.
func (c *Client) acquireWithPayload(ctx context.Context, x db.DBTX, req AcquireRequest) (Lease, error) {
	payload := req.Payload
	req.Payload = ""
	run := func(x db.DBTX) (Lease, error) {
		l, err := c.acquire(ctx, x, req)
		if err != nil {
			return Lease{}, err
		}
		// The lease was taken (or is held by this same attempt) in this
		// transaction, which holds its row lock: no other token can be
		// there, and an expiry within the transaction does not matter.
		r, err := c.core.Queries.LeasePayloadSet(ctx, x, db.LeasePayloadSetParams{
			Name: l.Name, Token: l.Token, Payload: pgtype.Text{String: payload, Valid: true}, RequireHeld: false,
		})
		if err != nil {
			return Lease{}, core.DBError("store lease payload", err)
		}
		l.Payload = r.Payload
		return l, nil
	}
	// On the client's own executor (Acquire, AcquireWait: the pool, or the
	// pool wrapped to mark lost replies) both statements run in one
	// transaction, so no reader ever sees the lease without its payload; in
	// the caller's transaction (AcquireTx) they share that one.
	switch p := x.(type) {
	case *pgxpool.Pool:
		return dbutil.WithTxResult(ctx, p, func(tx pgx.Tx) (Lease, error) { return run(tx) })
	case core.SentPool:
		return dbutil.WithTxResult(ctx, p.Pool, func(tx pgx.Tx) (Lease, error) { return run(tx) })
	case pgx.Tx:
		return run(p)
	default:
		return Lease{}, core.Errorf("pgquota: acquire with a payload needs a pool or a transaction, got %T", x)
	}
}

// SetPayload stores payload with lease l (its Name and Token; the other
// fields are not read),
// replacing the one it had (an empty payload clears it), in one statement
// conditioned on the token and on the lease being held by the database
// clock, so a deposed holder can never overwrite its successor's payload.
// The returned Lease carries the new payload; its expiry is unchanged.
//
// Errors: *quota.InputError for a bad name, token or payload (valid UTF-8
// without NUL, at most MaxPayloadBytes bytes); ErrLost when the
// lease is not held with token (expired, released, taken over, or never
// acquired); quota.ErrSchemaMissing; database errors. Nothing is written on an
// error.
func (c *Client) SetPayload(ctx context.Context, l Lease, payload string) (Lease, error) {
	return c.setLeasePayload(ctx, c.core.DB, l.Name, l.Token, payload)
}

// SetPayloadTx is SetPayload inside the caller's transaction.
func (c *Client) SetPayloadTx(ctx context.Context, tx pgx.Tx, l Lease, payload string) (Lease, error) {
	return c.setLeasePayload(ctx, tx, l.Name, l.Token, payload)
}

func (c *Client) setLeasePayload(ctx context.Context, x db.DBTX, name string, token int64, payload string) (Lease, error) {
	if err := core.CheckName("lease name", name); err != nil {
		return Lease{}, err
	}
	if err := checkToken(token); err != nil {
		return Lease{}, err
	}
	if err := checkPayload(payload); err != nil {
		return Lease{}, err
	}
	p := pgtype.Text{String: payload, Valid: payload != ""}
	sent := time.Now()
	r, err := c.core.Queries.LeasePayloadSet(ctx, x, db.LeasePayloadSetParams{Name: name, Token: token, Payload: p, RequireHeld: true})
	if core.IsNoRows(err) {
		return Lease{}, c.leaseLost(ctx, x, "set the payload of", name, token)
	}
	if err != nil {
		return Lease{}, core.DBError("set lease payload", err)
	}
	l := leaseFrom(db.PgquotaLease{
		Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
	}, r.DbNow, sent)
	l.Payload = r.Payload
	return l, nil
}
