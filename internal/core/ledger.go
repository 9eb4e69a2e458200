package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
)

// Operations recorded in the ledger (quota.LedgerEntry.Operation).
const (
	OpNameGrant  = "grant"
	OpNameRevoke = "revoke"
	OpNameClaim  = "claim"
)

// CheckKey validates an idempotency key (quota.IdempotencyKey's Key and
// Scope) and returns its scope, defaultScope when scope is empty.
func CheckKey(key, scope, defaultScope string) (string, error) {
	if err := CheckName("idempotency key", key); err != nil {
		return scope, err
	}
	if scope == "" {
		scope = defaultScope
	}
	if err := CheckName("idempotency scope", scope); err != nil {
		return scope, err
	}
	return scope, nil
}

// Request is the fingerprint of a keyed request: what must match for a
// repeat to replay the first outcome.
type Request struct {
	Scope, Key string
	Operation  string
	Target     string
	Member     string
	Amount     int64
	Limit      pgtype.Int8
}

// Check returns nil when entry e was recorded for the same request as r,
// and an error wrapping ErrIdempotencyKeyReused naming the difference
// otherwise.
func (r Request) Check(e db.PgquotaLedgerEntry) error {
	var diff string
	switch {
	case e.Operation != r.Operation:
		diff = fmt.Sprintf("operation %s, not %s", e.Operation, r.Operation)
	case e.Target != r.Target:
		diff = fmt.Sprintf("target %q, not %q", e.Target, r.Target)
	case e.Member != r.Member:
		diff = fmt.Sprintf("member %q, not %q", e.Member, r.Member)
	case e.Amount != r.Amount:
		diff = fmt.Sprintf("amount %d, not %d", e.Amount, r.Amount)
	case e.RequestLimit != r.Limit:
		diff = fmt.Sprintf("limit %s, not %s", LimitString(e.RequestLimit), LimitString(r.Limit))
	default:
		return nil
	}
	return Errorf("%w: key %q in scope %q is grant %d, made with %s",
		ErrIdempotencyKeyReused, r.Key, r.Scope, e.GrantID, diff)
}

// LimitString is a request's limit as messages name it: its value, or "none".
func LimitString(l pgtype.Int8) string {
	if !l.Valid {
		return "none"
	}
	return fmt.Sprint(l.Int64)
}

// ErrKeyVanished is returned by RunKeyed when the key's ledger entry was
// reaped between the keyed statement and the read of the entry, three
// times in a row.
var ErrKeyVanished = errors.New("pgquota: the idempotency key's ledger entry was removed while it was read; try again")

// RunKeyed runs a keyed statement. When stmt reports a prior grant id (the
// key was already taken, and stmt wrote nothing), the prior entry is read
// in the same executor, checked against req, and replayed. An entry reaped
// in between frees the key, so the statement runs again.
func RunKeyed[T any](ctx context.Context, q *db.Queries, x db.DBTX, req Request,
	stmt func() (res T, prior int64, err error), replay func(e db.PgquotaLedgerEntry) T) (T, error) {
	var zero T
	for range 3 {
		res, prior, err := stmt()
		if err != nil || prior == 0 {
			return res, err
		}
		e, err := q.LedgerGet(ctx, ReadsOf(x), prior)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return zero, DBError("read ledger", err)
		}
		if err := req.Check(e); err != nil {
			return zero, err
		}
		return replay(e), nil
	}
	return zero, ErrKeyVanished
}
