package quota

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// IdempotencyKey names one logical operation, so that the operation can be
// repeated safely: a retry after a timeout, a double-click, a message
// delivered twice. The first call with a key records its request and its
// outcome in the grant ledger, in the same statement as the counter change;
// every later call with the same key and the same request gets that first
// outcome back (Keyed.Replayed) and changes nothing, also when the copies
// run concurrently and when the first call's reply was lost after it
// committed. A call with the same key and a different request fails with
// ErrIdempotencyKeyReused and writes nothing.
//
// Every outcome is stored and replayed, denials included: a denied grant
// repeated with its key is denied again, even after the window has rolled
// over or units were given back. The key names one attempt; a new attempt
// needs a new key. Errors are not stored (nothing was written): a call that
// failed can be repeated with the same key.
//
// Keys are kept until ReapLedger removes them; a repeat after that is a new
// operation. Keep them for longer than any client retries.
//
// This follows Stripe's idempotency keys ("Designing robust and
// predictable APIs with idempotency", Brandur Leach, 2017) and the IETF
// HTTPAPI draft "The Idempotency-Key HTTP Header Field".
type IdempotencyKey struct {
	// Key is chosen by the caller, typically a UUID made once per logical
	// operation, or an id the operation already has (an order id and a
	// step). 1 to MaxNameBytes bytes, no control characters. An empty Key
	// means no idempotency: the call is not recorded in the ledger.
	Key string
	// Scope is the namespace in which Key is unique. 1 to MaxNameBytes
	// bytes, no control characters. Defaults to the quota name (grants and
	// revokes) or the campaign (voucher claims).
	Scope string
}

// Keyed is the ledger record of an operation made with an idempotency key.
// GrantResult, RevokeResult and voucher.ClaimResult embed it; it is zero for an operation
// without a key.
type Keyed struct {
	// GrantID identifies the operation's ledger entry: CompensateGrant takes it
	// to give a grant's units back, EnqueueOpts carries it into outbox
	// events, and `pgquota ledger show --grant-id` prints the entry.
	// Grant ids are positive and increase in the order entries were
	// created.
	GrantID int64 `json:"grant_id"`
	// IdempotencyScope and IdempotencyKey are the key the operation was
	// recorded under.
	IdempotencyScope string `json:"idempotency_scope"`
	IdempotencyKey   string `json:"idempotency_key"`
	// Replayed reports that an earlier call with this key made the
	// operation: this result is the stored first outcome, and this call
	// changed nothing. Usage figures (Used, Remaining, ...) are those of the
	// first call.
	Replayed bool `json:"replayed"`
}

// Operations recorded in the ledger (LedgerEntry.Operation).
const (
	OpGrant  = core.OpNameGrant
	OpRevoke = core.OpNameRevoke
	OpClaim  = core.OpNameClaim
)

// checkKey validates an idempotency key and fills in its default scope
// (core.CheckKey).
func checkKey(k IdempotencyKey, defaultScope string) (IdempotencyKey, error) {
	var err error
	k.Scope, err = core.CheckKey(k.Key, k.Scope, defaultScope)
	return k, err
}

// request is the fingerprint of a keyed request: what must match for a
// repeat to replay the first outcome (core.Request).
type request struct {
	key       IdempotencyKey
	operation string
	target    string
	member    string
	amount    int64
	limit     pgtype.Int8
}

// fingerprint is r as the ledger machinery (internal/core) takes it.
func (r request) fingerprint() core.Request {
	return core.Request{Scope: r.key.Scope, Key: r.key.Key, Operation: r.operation, Target: r.target, Member: r.member, Amount: r.amount, Limit: r.limit}
}

// runKeyed is core.RunKeyed on the client's queries.
func runKeyed[T any](ctx context.Context, c *Client, x db.DBTX, req request,
	stmt func() (res T, prior int64, err error), replay func(e db.PgquotaLedgerEntry) T) (T, error) {
	return core.RunKeyed(ctx, c.queries, x, req.fingerprint(), stmt, replay)
}

func keyedFromEntry(e db.PgquotaLedgerEntry) Keyed {
	return Keyed{GrantID: e.GrantID, IdempotencyScope: e.Scope, IdempotencyKey: e.IdempotencyKey, Replayed: true}
}

// grantKeyed runs a validated keyed grant request, given its fingerprint.
func (c *Client) grantKeyed(ctx context.Context, x db.DBTX, fp request) (GrantResult, error) {
	key, limit := fp.key, fp.limit
	req := GrantRequest{Quota: fp.target, Member: fp.member, Amount: fp.amount}
	return runKeyed(ctx, c, x, fp, func() (GrantResult, int64, error) {
		row, err := c.queries.LedgerGrant(ctx, x, db.LedgerGrantParams{
			Scope:          key.Scope,
			IdempotencyKey: key.Key,
			LimitValue:     limit,
			Member:         req.Member,
			QuotaName:      req.Quota,
			Amount:         req.Amount,
		})
		switch {
		case err != nil:
			return GrantResult{}, 0, core.DBError("grant", err)
		case row.PriorGrantID != 0:
			return GrantResult{}, row.PriorGrantID, nil
		case !row.QuotaFound:
			c.kinds.Delete(req.Quota)
			return GrantResult{}, 0, core.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
		}
		w := Window(row.Kind)
		c.kinds.Store(req.Quota, w)
		switch {
		case w.Shaped():
			return GrantResult{}, 0, errKeyedShaped() // nothing was written
		case !row.HasLimit:
			return GrantResult{}, 0, core.Errorf("%w (quota %q, member %q)", ErrNoLimit, req.Quota, req.Member)
		}
		return GrantResult{
			Granted:     row.Granted,
			Quota:       req.Quota,
			Member:      req.Member,
			Amount:      req.Amount,
			Used:        row.Used,
			Limit:       row.LimitValue,
			Remaining:   max(row.LimitValue-row.Used, 0),
			WindowStart: core.TimeFromPG(row.WindowStart),
			WindowEnd:   core.TimeFromPG(row.WindowEnd),
			RetryAfter:  usDuration(row.RetryAfterUs),
			ResetAfter:  usDuration(row.ResetAfterUs),
			DecidedAt:   core.TimeFromPG(row.DecidedAt),
			Keyed:       Keyed{GrantID: row.GrantID, IdempotencyScope: key.Scope, IdempotencyKey: key.Key},
		}, 0, nil
	}, grantFromEntry)
}

// revokeKeyed runs a keyed revoke request, validated by revoke
// (checkRevokeRequest, which filled in key's scope).
func (c *Client) revokeKeyed(ctx context.Context, x db.DBTX, req RevokeRequest, key IdempotencyKey) (RevokeResult, error) {
	fp := request{key: key, operation: OpRevoke, target: req.Quota, member: req.Member, amount: req.Amount}
	return runKeyed(ctx, c, x, fp, func() (RevokeResult, int64, error) {
		row, err := c.queries.LedgerRevoke(ctx, x, db.LedgerRevokeParams{
			Scope:          key.Scope,
			IdempotencyKey: key.Key,
			QuotaName:      req.Quota,
			Member:         req.Member,
			Amount:         req.Amount,
		})
		switch {
		case err != nil:
			return RevokeResult{}, 0, core.DBError("revoke", err)
		case row.PriorGrantID != 0:
			return RevokeResult{}, row.PriorGrantID, nil
		case !row.QuotaFound:
			return RevokeResult{}, 0, core.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
		case Window(row.Kind).Shaped():
			return RevokeResult{}, 0, calendarOnlyError("revoke", req.Quota, Window(row.Kind)) // nothing was written
		}
		return RevokeResult{
			Quota:       req.Quota,
			Member:      req.Member,
			Amount:      req.Amount,
			Revoked:     row.Revoked,
			Used:        row.Used,
			WindowStart: core.TimeFromPG(row.WindowStart),
			WindowEnd:   core.TimeFromPG(row.WindowEnd),
			Keyed:       Keyed{GrantID: row.GrantID, IdempotencyScope: key.Scope, IdempotencyKey: key.Key},
		}, 0, nil
	}, func(e db.PgquotaLedgerEntry) RevokeResult {
		return RevokeResult{
			Quota:       e.Target,
			Member:      e.Member,
			Amount:      e.Amount,
			Revoked:     e.Revoked,
			Used:        e.Used,
			WindowStart: core.TimeFromPG(e.WindowStart),
			WindowEnd:   core.TimeFromPG(e.WindowEnd),
			Keyed:       keyedFromEntry(e),
		}
	})
}

// CompensateGrantResult is the outcome of CompensateGrant: the compensation of one
// keyed grant.
type CompensateGrantResult struct {
	GrantID int64  `json:"grant_id"`
	Quota   string `json:"quota"`
	Member  string `json:"member"`
	// Granted reports whether the grant took units; Amount is the number
	// it took (0 for a denied grant, which has nothing to give back).
	Granted bool  `json:"granted"`
	Amount  int64 `json:"amount"`
	// Revoked is the number of units given back: Amount, or less when the
	// window's counter held fewer units (it never goes below zero).
	Revoked int64 `json:"revoked"`
	// Used is the counter of the grant's window right after the units were
	// given back.
	Used int64 `json:"used"`
	// WindowStart and WindowEnd bound the grant's window: the units go
	// back to that window's counter, not to the current window's.
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// RevokedAt is when the grant was revoked, by the database clock.
	RevokedAt time.Time `json:"revoked_at"`
	// Replayed reports that an earlier call revoked the grant: this result
	// is that first revoke's outcome, and this call changed nothing.
	Replayed bool `json:"replayed"`
}

// CompensateGrant gives back the units of one keyed grant (one made with an
// idempotency key; its GrantResult.GrantID): the compensating action of a
// saga whose later step failed (Garcia-Molina and Salem, "Sagas", SIGMOD
// 1987). The units go back to the counter of the grant's own window, even
// when that window has ended, never more than the grant took and never
// below zero (less when the counter holds fewer units, for instance after
// a Revoke). A grant is revoked at most once: a repeated or concurrent
// CompensateGrant of the same grant changes nothing and reports the first
// revoke's outcome with Replayed set. Revoking a denied grant gives nothing
// back. It is one SQL statement (two when replaying); serialization
// failures and deadlocks are retried as for Grant.
//
// Errors: *InputError for a grant id below 1; ErrGrantNotFound when no
// keyed grant has that id (including reaped ones); ErrSchemaMissing;
// database errors.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, a CompensateGrant repeated with the same grant
// id revokes at most once and reports the first outcome (Replayed).
func (c *Client) CompensateGrant(ctx context.Context, grantID int64) (CompensateGrantResult, error) {
	return c.revokeGrant(ctx, c.db, grantID)
}

// CompensateGrantTx is CompensateGrant inside the caller's transaction: the units
// are given back when tx commits. A concurrent revoke of the same grant
// waits for tx. Serialization failures and deadlocks are returned
// unchanged, as for GrantTx.
func (c *Client) CompensateGrantTx(ctx context.Context, tx pgx.Tx, grantID int64) (CompensateGrantResult, error) {
	return c.revokeGrant(ctx, tx, grantID)
}

func (c *Client) revokeGrant(ctx context.Context, x db.DBTX, grantID int64) (CompensateGrantResult, error) {
	if grantID < 1 {
		return CompensateGrantResult{}, core.Invalid("grant id", "must be at least 1, got %d", grantID)
	}
	row, err := c.queries.LedgerRevokeGrant(ctx, x, grantID)
	if isNoRows(err) {
		return CompensateGrantResult{}, core.Errorf("%w: no keyed grant has id %d", ErrGrantNotFound, grantID)
	}
	if err != nil {
		return CompensateGrantResult{}, core.DBError("revoke grant", err)
	}
	res := CompensateGrantResult{
		GrantID:     row.GrantID,
		Quota:       row.Target,
		Member:      row.Member,
		Granted:     row.Granted,
		WindowStart: core.TimeFromPG(row.WindowStart),
		WindowEnd:   core.TimeFromPG(row.WindowEnd),
	}
	if row.Granted {
		res.Amount = row.Amount
	}
	if row.RevokedNow {
		if row.Compensated > 0 && row.WrittenUsed != row.CompensatedUsed {
			// Cannot happen: the counter row stays locked from the read
			// the compensation was computed from to the write.
			return CompensateGrantResult{}, core.Errorf("pgquota: revoke grant %d: the counter was written as %d, the compensation recorded %d",
				grantID, row.WrittenUsed, row.CompensatedUsed)
		}
		res.Revoked, res.Used, res.RevokedAt = row.Compensated, row.CompensatedUsed, core.TimeFromPG(row.CompensatedAt)
		return res, nil
	}
	// An earlier revoke marked the grant: one that committed before this
	// statement's snapshot, or one this statement waited for. The next
	// statement sees it either way (under READ COMMITTED it takes a new
	// snapshot; under REPEATABLE READ the statement above would have failed
	// with 40001 had the revoke committed after the snapshot).
	e, err := c.queries.LedgerGet(ctx, x, grantID)
	if isNoRows(err) {
		// Reaped while the statement above waited for its outcome row:
		// nothing was given back.
		return CompensateGrantResult{}, core.Errorf("%w: no keyed grant has id %d", ErrGrantNotFound, grantID)
	}
	if err != nil {
		return CompensateGrantResult{}, core.DBError("revoke grant", err)
	}
	res.Replayed = true
	res.Revoked, res.Used, res.RevokedAt = e.Compensated.Int64, e.CompensatedUsed.Int64, core.TimeFromPG(e.CompensatedAt)
	return res, nil
}

// LedgerEntry is one keyed operation as the ledger stores it: the request
// and its outcome.
type LedgerEntry struct {
	GrantID          int64  `json:"grant_id"`
	IdempotencyScope string `json:"idempotency_scope"`
	IdempotencyKey   string `json:"idempotency_key"`
	// Operation is OpGrant, OpRevoke or OpClaim.
	Operation string `json:"operation"`
	// Target is the quota name (grants, revokes) or the campaign (claims).
	Target string `json:"target"`
	Member string `json:"member"`
	// Amount is the number of units asked for (1 for a claim).
	Amount int64 `json:"amount"`
	// RequestLimit is the limit the call gave, nil when it gave none.
	RequestLimit *int64    `json:"request_limit"`
	CreatedAt    time.Time `json:"created_at"`

	// Granted is the outcome: units granted (grant), a voucher held
	// (claim); always true for a revoke.
	Granted bool `json:"granted"`
	// Used is the counter after the operation (grants and revokes; for a
	// counted pool's claim, the pool's claimed count when a unit was handed
	// out).
	Used int64 `json:"used"`
	// Limit is the limit a grant was decided against, or a campaign's
	// total.
	Limit int64 `json:"limit"`
	// Revoked is the number of units a revoke gave back.
	Revoked     int64     `json:"revoked"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// Seq, Code, Repeat and ClaimedAt describe a claim's voucher, as in
	// voucher.ClaimResult.
	Seq       int64     `json:"seq"`
	Code      string    `json:"code"`
	Repeat    bool      `json:"repeat"`
	ClaimedAt time.Time `json:"claimed_at"`
	// DecidedAt is when the outcome was decided, by the database clock.
	DecidedAt time.Time `json:"decided_at"`
	// Compensation is the grant's CompensateGrant, nil while it has none.
	Compensation *Compensation `json:"compensation"`
}

// Compensation records the CompensateGrant of a grant.
type Compensation struct {
	// Revoked is the number of units given back.
	Revoked int64 `json:"revoked"`
	// Used is the grant window's counter right after.
	Used int64     `json:"used"`
	At   time.Time `json:"at"`
}

func entryFromRow(e db.PgquotaLedgerEntry) LedgerEntry {
	out := LedgerEntry{
		GrantID:          e.GrantID,
		IdempotencyScope: e.Scope,
		IdempotencyKey:   e.IdempotencyKey,
		Operation:        e.Operation,
		Target:           e.Target,
		Member:           e.Member,
		Amount:           e.Amount,
		CreatedAt:        core.TimeFromPG(e.CreatedAt),
		Granted:          e.Granted,
		Used:             e.Used,
		Limit:            e.LimitValue,
		Revoked:          e.Revoked,
		WindowStart:      core.TimeFromPG(e.WindowStart),
		WindowEnd:        core.TimeFromPG(e.WindowEnd),
		Seq:              e.Seq,
		Code:             e.Code,
		Repeat:           e.Repeat,
		ClaimedAt:        core.TimeFromPG(e.ClaimedAt),
		DecidedAt:        core.TimeFromPG(e.DecidedAt),
	}
	if e.RequestLimit.Valid {
		out.RequestLimit = &e.RequestLimit.Int64
	}
	if e.CompensatedAt.Valid {
		out.Compensation = &Compensation{Revoked: e.Compensated.Int64, Used: e.CompensatedUsed.Int64, At: core.TimeFromPG(e.CompensatedAt)}
	}
	return out
}

// LedgerEntry returns the ledger entry with grant id grantID.
//
// Errors: *InputError for a grant id below 1; ErrGrantNotFound;
// ErrSchemaMissing; database errors.
func (c *Client) LedgerEntry(ctx context.Context, grantID int64) (LedgerEntry, error) {
	if grantID < 1 {
		return LedgerEntry{}, core.Invalid("grant id", "must be at least 1, got %d", grantID)
	}
	e, err := c.queries.LedgerGet(ctx, c.db.Reads(), grantID)
	if isNoRows(err) {
		return LedgerEntry{}, core.Errorf("%w: grant id %d", ErrGrantNotFound, grantID)
	}
	if err != nil {
		return LedgerEntry{}, core.DBError("read ledger", err)
	}
	return entryFromRow(e), nil
}

// LedgerEntryByKey returns the ledger entry recorded under an idempotency
// key. key.Scope is required here: there is no request to default it from.
//
// Errors: *InputError for a bad key or scope; ErrGrantNotFound;
// ErrSchemaMissing; database errors.
func (c *Client) LedgerEntryByKey(ctx context.Context, key IdempotencyKey) (LedgerEntry, error) {
	if err := core.CheckName("idempotency scope", key.Scope); err != nil {
		return LedgerEntry{}, err
	}
	if err := core.CheckName("idempotency key", key.Key); err != nil {
		return LedgerEntry{}, err
	}
	e, err := c.queries.LedgerGetByKey(ctx, c.db.Reads(), db.LedgerGetByKeyParams{Scope: key.Scope, IdempotencyKey: key.Key})
	if isNoRows(err) {
		return LedgerEntry{}, core.Errorf("%w: key %q in scope %q", ErrGrantNotFound, key.Key, key.Scope)
	}
	if err != nil {
		return LedgerEntry{}, core.DBError("read ledger", err)
	}
	return entryFromRow(e), nil
}

// ReapLedger deletes ledger entries created more than olderThan ago by the
// database clock, and returns how many it deleted. It deletes in batches of
// a few thousand rows, one short statement each, so it never holds many
// locks for long; run it periodically (`pgquota ledger reap --older-than
// 720h` from cron, say).
//
// The retention period is the caller's choice and must exceed the longest
// time a client may retry an operation: once its entry is gone, a key is
// free again, and a late repeat would run as a new operation. A reaped grant
// can no longer be revoked with CompensateGrant either. (Stripe keeps keys for
// 24 hours; a month is a safe default for grants that may be compensated
// later.)
//
// Errors: *InputError when olderThan is below one second; the context's
// error; ErrSchemaMissing; database errors (rows deleted by earlier batches
// stay deleted).
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call.
func (c *Client) ReapLedger(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < time.Second {
		return 0, core.Invalid("older than", "must be at least 1s, got %s", olderThan)
	}
	return core.Reap(ctx, func() (int64, error) {
		return c.queries.LedgerReap(ctx, c.db, db.LedgerReapParams{OlderThanUs: olderThan.Microseconds(), BatchSize: core.ReapBatch})
	}, "reap ledger")
}
