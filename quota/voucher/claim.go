package voucher

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// ClaimRequest asks for one voucher of a campaign for a member.
type ClaimRequest struct {
	// Campaign is the campaign's name, 1 to quota.MaxNameBytes bytes, no control
	// characters. It may be of any kind (KindCounted, KindSharded,
	// KindCodes): Claim serves each.
	Campaign string
	// Member is who claims, 1 to quota.MaxNameBytes bytes, no control characters.
	// A member holds at most one voucher per campaign.
	Member string
	// Idempotency, when its Key is set, records the claim in the ledger
	// under that key, as for quota.GrantRequest; its Scope defaults to Campaign.
	// A repeat with the same key and request returns the first outcome (a
	// sold-out result included) with Replayed set; the same key with
	// another campaign or member fails with quota.ErrIdempotencyKeyReused.
	Idempotency quota.IdempotencyKey
}

// checkClaimRequest validates a claim request, once, and returns its
// fingerprint (the key with its default scope filled in).
func checkClaimRequest(req ClaimRequest) (core.Request, error) {
	if err := core.CheckName("campaign", req.Campaign); err != nil {
		return core.Request{}, err
	}
	if err := core.CheckName("member", req.Member); err != nil {
		return core.Request{}, err
	}
	key := req.Idempotency
	if key.Key != "" {
		var err error
		if key.Scope, err = core.CheckKey(key.Key, key.Scope, req.Campaign); err != nil {
			return core.Request{}, err
		}
	}
	return core.Request{Scope: key.Scope, Key: key.Key, Operation: core.OpNameClaim, Target: req.Campaign, Member: req.Member, Amount: 1}, nil
}

// Claim hands member one voucher of a campaign, whatever its kind, in one
// SQL call (pgquota.claim, or pgquota.claim_keyed with an idempotency key:
// migrations/00015_sql_claims.sql, docs/sql.md):
//
//   - a counted pool (CreateCampaign): one unit while claimed < total,
//     numbered ClaimResult.Seq;
//   - a sharded pool (CreateShardedCampaign): a unit from a shard with units
//     left, starting at a random shard and skipping locked ones (FOR UPDATE
//     SKIP LOCKED); when every shard with units left is locked by claims in
//     progress, the same call waits for one of them. The result is sold out
//     only when every shard is full;
//   - a code campaign (ImportCodes): one unclaimed code (ClaimResult.Code).
//     Concurrent claimers take different codes (FOR UPDATE SKIP LOCKED)
//     instead of queueing; codes passed over because another claim holds
//     them locked are waited for (up to Config.CodeClaimWait), since that
//     claim may roll back.
//
// A member holds at most one voucher per campaign: a repeated claim (a
// double-click, a retry, a concurrent duplicate) returns the first claim
// with Repeat set and takes nothing. The total is never exceeded. A
// sold-out campaign is a result (Claimed false), not an error.
//
// The database function reads the campaign's kind and dispatches on it, so
// every claim is one round trip, the first one of a campaign included.
//
// With req.Idempotency the claim and its ledger row are one call; the
// ledger key is taken before the pool or shard row is locked, and every
// final outcome (sold out included) is stored. Serialization failures and
// deadlocks are retried as for quota.Client.Grant.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) for a bad campaign, member or
// idempotency key; ErrCampaignNotFound; ErrCodesBusy (code campaigns);
// quota.ErrIdempotencyKeyReused; the context's error; quota.ErrSchemaMissing; database
// errors (SQLSTATE kept; XX000 if a sharded pool found every shard full and
// then still had units, which cannot happen while units are never given
// back).
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call (with the same key, if
// any): a member holds at most one voucher, so the repeat returns the first
// claim (Repeat, or Replayed with a key) or claims once.
func (c *Client) Claim(ctx context.Context, req ClaimRequest) (cl ClaimResult, err error) {
	defer c.claimDone(ctx, core.OpClaim, c.core.M.Now(), &cl, &err)
	return c.claim(ctx, c.core.DB, req)
}

// ClaimTx is Claim inside the caller's transaction: the voucher is the
// member's when tx commits. The unit or code stays locked by tx until it
// ends: other claimers of a counted pool wait for it; claimers of a sharded
// pool or a code campaign take other shards or codes meanwhile. With an
// idempotency key, a concurrent call with the same key waits for tx.
// Serialization failures and deadlocks are returned unchanged, as for
// GrantTx.
func (c *Client) ClaimTx(ctx context.Context, tx pgx.Tx, req ClaimRequest) (cl ClaimResult, err error) {
	defer c.claimDone(ctx, core.OpClaimTx, c.core.M.Now(), &cl, &err)
	return c.claim(ctx, tx, req)
}

func (c *Client) claim(ctx context.Context, x db.DBTX, req ClaimRequest) (ClaimResult, error) {
	fp, err := checkClaimRequest(req)
	if err != nil {
		return ClaimResult{}, err
	}
	attempt := func() (ClaimResult, error) { return c.claimUnkeyed(ctx, x, fp.Target, fp.Member) }
	if fp.Key != "" {
		attempt = func() (ClaimResult, error) { return c.claimKeyed(ctx, x, fp) }
	}
	res, err := attempt()
	if !errors.Is(err, errCodesLocked) {
		return res, err
	}
	return c.whileCodesLocked(ctx, fp.Target, func() (ClaimResult, error) {
		res, err := attempt()
		if err != nil && !errors.Is(err, errCodesLocked) {
			return res, backoff.Permanent(err)
		}
		return res, err
	})
}

// claimUnkeyed runs pgquota.claim once. A code campaign whose unclaimed
// codes are all locked returns errCodesLocked, with nothing written. On a
// sharded pool this client claimed from before, the call passes the shard
// gate (shardGate) when the client owns its transaction; the pool's number
// of shards comes back with every claim.
func (c *Client) claimUnkeyed(ctx context.Context, x db.DBTX, campaign, member string) (ClaimResult, error) {
	params := db.VoucherClaimParams{Campaign: campaign, Member: member}
	cached, sharded := c.shardCounts.Load(campaign)
	var row db.VoucherClaimRow
	var err error
	if rp, own := x.(core.RetryPool); own && sharded {
		// Each attempt passes the gate on its own: a claim that must run
		// again (a serialization failure) gives its place up while it
		// backs off, instead of retrying ahead of the claims waiting.
		row, err = core.Retry(ctx, rp.Policy, func() (db.VoucherClaimRow, error) {
			release, err := c.shardGate(ctx, campaign, cached.(int))
			if err != nil {
				return db.VoucherClaimRow{}, err
			}
			defer release()
			return c.core.Queries.VoucherClaim(ctx, rp.Pool, params)
		})
	} else {
		row, err = c.core.Queries.VoucherClaim(ctx, x, params)
	}
	if err != nil {
		return ClaimResult{}, core.DBError("claim voucher", err)
	}
	switch {
	case !row.Found:
		return ClaimResult{}, core.Errorf("%w: %q", ErrCampaignNotFound, campaign)
	case CampaignKind(row.Kind) == KindSharded:
		if !sharded || cached.(int) != int(row.Shards) {
			c.shardCounts.Store(campaign, int(row.Shards))
		}
	case sharded:
		c.shardCounts.Delete(campaign) // the campaign was recreated as another kind
	}
	if row.Busy {
		return ClaimResult{}, errCodesLocked
	}
	return ClaimResult{
		Campaign:  campaign,
		Member:    member,
		Claimed:   row.Claimed,
		Repeat:    row.Repeat,
		Seq:       row.Seq,
		Code:      row.Code,
		ClaimedAt: core.TimeFromPG(row.ClaimedAt),
		Total:     row.Total,
	}, nil
}

// claimKeyed runs pgquota.claim_keyed once: the claim and its ledger row
// in one call. fp is the request's fingerprint (checkClaimRequest). A code
// campaign whose unclaimed codes are all locked returns errCodesLocked,
// with nothing written (no ledger row either).
func (c *Client) claimKeyed(ctx context.Context, x db.DBTX, fp core.Request) (ClaimResult, error) {
	campaign, member := fp.Target, fp.Member
	return core.RunKeyed(ctx, c.core.Queries, x, fp, func() (ClaimResult, int64, error) {
		row, err := c.core.Queries.LedgerClaim(ctx, x, db.LedgerClaimParams{
			Scope: fp.Scope, IdempotencyKey: fp.Key, Campaign: campaign, Member: member,
		})
		switch {
		case err != nil:
			return ClaimResult{}, 0, core.DBError("claim voucher", err)
		case row.PriorGrantID != 0:
			return ClaimResult{}, row.PriorGrantID, nil
		case !row.CampaignFound:
			return ClaimResult{}, 0, core.Errorf("%w: %q", ErrCampaignNotFound, campaign)
		case row.Busy:
			return ClaimResult{}, 0, errCodesLocked
		}
		return ClaimResult{
			Campaign:  campaign,
			Member:    member,
			Claimed:   row.Claimed,
			Repeat:    row.Repeat,
			Seq:       row.Seq,
			Code:      row.Code,
			ClaimedAt: core.TimeFromPG(row.ClaimedAt),
			Total:     row.Total,
			Keyed:     quota.Keyed{GrantID: row.GrantID, IdempotencyScope: fp.Scope, IdempotencyKey: fp.Key},
		}, 0, nil
	}, claimFromEntry)
}

// claimDone is the metrics hook of Claim and ClaimTx.
func (c *Client) claimDone(ctx context.Context, o core.Op, start time.Time, cl *ClaimResult, err *error) {
	c.core.M.ClaimDone(ctx, o, start, cl.Repeat, cl.Claimed, err)
}

// claimFromEntry replays a keyed claim's stored outcome.
func claimFromEntry(e db.PgquotaLedgerEntry) ClaimResult {
	return ClaimResult{
		Campaign:  e.Target,
		Member:    e.Member,
		Claimed:   e.Granted,
		Repeat:    e.Repeat,
		Seq:       e.Seq,
		Code:      e.Code,
		ClaimedAt: core.TimeFromPG(e.ClaimedAt),
		Total:     e.LimitValue,
		Keyed:     quota.Keyed{GrantID: e.GrantID, IdempotencyScope: e.Scope, IdempotencyKey: e.IdempotencyKey, Replayed: true},
	}
}
