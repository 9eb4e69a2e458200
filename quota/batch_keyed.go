package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Keyed batches: GrantBatch requests (and coalesced Grant calls) that carry
// an idempotency key. See queries/ledger_batch.sql for the order of the
// statements and why each keyed request gets exactly one ledger entry (its
// own grant id) whose outcome is the one the batch applied.

// errKeyedUndecided marks a keyed batch that recorded a key whose request
// then could not be decided (its limit or quota changed between the
// batch's statements): the transaction must roll back. GrantBatch then runs
// it again, and the new run sees the change before it records the key.
var errKeyedUndecided = errors.New("the limit or quota changed while the batch ran")

// anyKeyed reports whether a request of reqs carries an idempotency key.
func anyKeyed(reqs []GrantRequest) bool {
	for _, r := range reqs {
		if r.Idempotency.Key != "" {
			return true
		}
	}
	return false
}

// fingerprint is a keyed grant request's ledger fingerprint.
func fingerprint(req GrantRequest) request {
	key := req.Idempotency // validated before (checkGrantRequest)
	if key.Scope == "" {
		key.Scope = req.Quota
	}
	var limit pgtype.Int8
	if req.Limit != nil {
		limit = pgtype.Int8{Int64: *req.Limit, Valid: true}
	}
	return request{key: key, operation: OpGrant, target: req.Quota, member: req.Member, amount: req.Amount, limit: limit}
}

// sameRequest reports whether two keyed requests are the same request (a
// repeat replays the first outcome), or names the first difference.
func sameRequest(a, b request) string {
	switch {
	case a.target != b.target:
		return fmt.Sprintf("target %q, not %q", a.target, b.target)
	case a.member != b.member:
		return fmt.Sprintf("member %q, not %q", a.member, b.member)
	case a.amount != b.amount:
		return fmt.Sprintf("amount %d, not %d", a.amount, b.amount)
	case a.limit != b.limit:
		return fmt.Sprintf("limit %s, not %s", core.LimitString(a.limit), core.LimitString(b.limit))
	}
	return ""
}

// grantFromEntry replays a stored grant outcome, with the RetryAfter and
// ResetAfter of calendarWaits.
func grantFromEntry(e db.PgquotaLedgerEntry) GrantResult {
	retry, reset := calendarWaits(e.Granted, e.Amount, e.LimitValue, e.WindowEnd, e.DecidedAt)
	return GrantResult{
		Granted:     e.Granted,
		Quota:       e.Target,
		Member:      e.Member,
		Amount:      e.Amount,
		Used:        e.Used,
		Limit:       e.LimitValue,
		Remaining:   max(e.LimitValue-e.Used, 0),
		WindowStart: core.TimeFromPG(e.WindowStart),
		WindowEnd:   core.TimeFromPG(e.WindowEnd),
		RetryAfter:  retry,
		ResetAfter:  reset,
		DecidedAt:   core.TimeFromPG(e.DecidedAt),
		Keyed:       keyedFromEntry(e),
	}
}

// calendarWaits are a stored calendar grant's RetryAfter and ResetAfter as
// pgquota.grant_counter (migrations/00014) computed them when it decided
// the grant at decidedAt: retry 0 when granted, Never for an amount above
// the limit or a lifetime window (an infinite end), else the time to the
// window's end; reset the time to the window's end, Never for a lifetime
// window. Timestamps hold whole microseconds, so the SQL's rounding up is
// exact here. Tests compare a keyed grant's result with its replay.
func calendarWaits(granted bool, amount, limit int64, windowEnd, decidedAt pgtype.Timestamptz) (retry, reset time.Duration) {
	if !windowEnd.Valid || !decidedAt.Valid || windowEnd.InfinityModifier != pgtype.Finite {
		reset = Never
	} else {
		reset = windowEnd.Time.Sub(decidedAt.Time)
	}
	switch {
	case granted:
		return 0, reset
	case amount > limit:
		return Never, reset
	}
	return reset, reset
}

// grantBatchKeyed decides the requests todo (valid, some keyed) in the
// transaction x: it records the keys, grants the requests whose key it
// recorded together with the unkeyed ones in one statement that also
// stores the keyed outcomes it decided (UsageGrantBatchKeyed), and replays
// the keys that were already taken. x must be a transaction (or a
// savepoint): the ledger rows, the grants and the outcomes commit together.
func (c *Client) grantBatchKeyed(ctx context.Context, x db.DBTX, reqs []GrantRequest, todo []int, out []BatchOutcome) error {
	// Keys repeated within the batch: the first copy is sent, the others
	// replay it.
	type keyName struct{ scope, key string }
	fps := make(map[int]request)
	first := make(map[keyName]int)
	dupOf := make(map[int]int)
	var ins db.LedgerBatchInsertParams
	var sendIdx []int // indexes of the keyed requests sent to LedgerBatchInsert
	for _, i := range todo {
		if reqs[i].Idempotency.Key == "" {
			continue
		}
		fp := fingerprint(reqs[i])
		fps[i] = fp
		k := keyName{fp.key.Scope, fp.key.Key}
		if f, ok := first[k]; ok {
			dupOf[i] = f
			continue
		}
		first[k] = i
		limit := int64(-1)
		if reqs[i].Limit != nil {
			limit = *reqs[i].Limit
		}
		ins.Scopes = append(ins.Scopes, fp.key.Scope)
		ins.Keys = append(ins.Keys, fp.key.Key)
		ins.QuotaNames = append(ins.QuotaNames, reqs[i].Quota)
		ins.Members = append(ins.Members, reqs[i].Member)
		ins.Amounts = append(ins.Amounts, reqs[i].Amount)
		ins.LimitValues = append(ins.LimitValues, limit)
		sendIdx = append(sendIdx, i)
	}

	// 1. The ledger rows.
	recorded, err := c.queries.LedgerBatchInsert(ctx, x, ins)
	if err != nil {
		return core.DBError("grant batch", err)
	}
	grantIDs := make(map[keyName]int64, len(recorded))
	for _, r := range recorded {
		grantIDs[keyName{r.Scope, r.IdempotencyKey}] = r.GrantID
	}
	// Keys not recorded now: taken before (replayed), or not recordable
	// because the quota is missing or no limit applies.
	var prior db.LedgerBatchEntriesParams
	for _, i := range sendIdx {
		k := keyName{fps[i].key.Scope, fps[i].key.Key}
		if _, ok := grantIDs[k]; !ok {
			prior.Scopes = append(prior.Scopes, k.scope)
			prior.Keys = append(prior.Keys, k.key)
		}
	}
	entries := make(map[keyName]db.PgquotaLedgerEntry)
	if len(prior.Keys) > 0 {
		rows, err := c.queries.LedgerBatchEntries(ctx, x, prior)
		if err != nil {
			return core.DBError("grant batch: read ledger", err)
		}
		for _, e := range rows {
			entries[keyName{e.Scope, e.IdempotencyKey}] = e
		}
	}

	// 2. The grants: unkeyed requests and the keys recorded now, in order.
	// A keyed request neither recorded nor in the ledger runs alone
	// through the ledger's own statement, which reports why (no quota, no
	// limit) or, should that have changed since, grants it with its key.
	var part, alone []int
	recordedID := make(map[int]int64)
	for _, i := range todo {
		if _, dup := dupOf[i]; dup {
			continue
		}
		if reqs[i].Idempotency.Key == "" {
			part = append(part, i)
			continue
		}
		k := keyName{fps[i].key.Scope, fps[i].key.Key}
		if id, ok := grantIDs[k]; ok {
			part = append(part, i)
			recordedID[i] = id
			continue
		}
		if e, ok := entries[k]; ok {
			if err := fps[i].fingerprint().Check(e); err != nil {
				out[i].Err = err
				continue
			}
			out[i].GrantResult = grantFromEntry(e)
			continue
		}
		alone = append(alone, i)
	}
	// The grants and, in the same statement, the outcomes of the keys
	// recorded now, as the statement decided them (never sent from here).
	if len(part) > 0 {
		ids := recordedID
		if len(ids) == 0 {
			ids = nil // no key recorded now: the unkeyed statement
		}
		if err := c.grantBatchStatement(ctx, x, reqs, part, out, ids); err != nil {
			return err
		}
	}
	for _, i := range part {
		id, ok := recordedID[i]
		if !ok {
			continue
		}
		if out[i].Err != nil {
			// A recorded key must get an outcome: the quota or the
			// member's limit changed since the key was recorded. The
			// whole batch fails (and its transaction must roll back).
			return core.Errorf("pgquota: grant batch: keyed request (key %q) could not be decided: %w: %w", fps[i].key.Key, errKeyedUndecided, out[i].Err)
		}
		out[i].Keyed = Keyed{GrantID: id, IdempotencyScope: fps[i].key.Scope, IdempotencyKey: fps[i].key.Key}
	}

	for _, i := range alone {
		res, err := c.grant(ctx, x, reqs[i])
		out[i].GrantResult, out[i].Err = res, err
	}
	// Copies of a key within the batch replay its first copy.
	for i, f := range dupOf {
		if diff := sameRequest(fps[f], fps[i]); diff != "" {
			out[i].Err = core.Errorf("%w: key %q in scope %q is another request of the batch, made with %s",
				ErrIdempotencyKeyReused, fps[i].key.Key, fps[i].key.Scope, diff)
			continue
		}
		out[i].GrantResult, out[i].Err = out[f].GrantResult, out[f].Err
		if out[i].GrantID != 0 {
			out[i].Replayed = true
		}
	}
	return nil
}
