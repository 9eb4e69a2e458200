package quota

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
)

// ClaimRequest asks for one voucher of a campaign for a member.
type ClaimRequest struct {
	// Campaign is the campaign's name, 1 to MaxNameBytes bytes, no control
	// characters. It may be of any kind (KindCounted, KindSharded,
	// KindCodes): Claim serves each.
	Campaign string
	// Member is who claims, 1 to MaxNameBytes bytes, no control characters.
	// A member holds at most one voucher per campaign.
	Member string
	// Idempotency, when its Key is set, records the claim in the ledger
	// under that key, as for GrantRequest; its Scope defaults to Campaign.
	// A repeat with the same key and request returns the first outcome (a
	// sold-out result included) with Replayed set; the same key with
	// another campaign or member fails with ErrIdempotencyKeyReused.
	Idempotency IdempotencyKey
}

// errOtherKind is returned by a claim path that found the campaign to be
// of a kind it does not serve; it wrote nothing, and Claim takes the
// other path.
var errOtherKind = errors.New("pgquota: the campaign is of another kind")

// checkClaimRequest validates a claim request, once, and returns its
// fingerprint (the key with its default scope filled in).
func checkClaimRequest(req ClaimRequest) (request, error) {
	if err := checkName("campaign", req.Campaign); err != nil {
		return request{}, err
	}
	if err := checkName("member", req.Member); err != nil {
		return request{}, err
	}
	key := req.Idempotency
	if key.Key != "" {
		var err error
		if key, err = checkKey(key, req.Campaign); err != nil {
			return request{}, err
		}
	}
	return request{key: key, operation: OpClaim, target: req.Campaign, member: req.Member, amount: 1}, nil
}

// Claim hands member one voucher of a campaign, whatever its kind, in one
// SQL statement:
//
//   - a counted pool (CreateCampaign): one unit while claimed < total,
//     numbered ClaimResult.Seq;
//   - a sharded pool (CreateShardedCampaign): a unit from a shard with units
//     left, starting at a random shard and skipping locked ones (FOR UPDATE
//     SKIP LOCKED); when every shard with units left is locked by claims in
//     progress, the same statement waits for one of them. The result is
//     sold out only when every shard is full;
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
// One call serves every kind because the statements report the campaign's
// kind and write nothing for a kind they do not serve: the first claim of a
// campaign by a client may take a second statement to learn that it holds
// codes or shards (two for a sharded pool with an idempotency key), and the
// client remembers the kind from then on.
//
// With req.Idempotency the claim and its ledger row are one statement. On a
// sharded pool a keyed claim waits for a locked shard rather than skipping
// it (queries/voucher_shard.sql, LedgerClaimShard), so that a stored
// sold-out outcome is exact. Serialization failures and deadlocks are
// retried as for Grant.
//
// Errors: *InputError (ErrInvalidInput) for a bad campaign, member or
// idempotency key; ErrCampaignNotFound; ErrCodesBusy (code campaigns);
// ErrIdempotencyKeyReused; the context's error; ErrSchemaMissing; database
// errors (SQLSTATE kept).
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call (with the same key, if
// any): a member holds at most one voucher, so the repeat returns the first
// claim (Repeat, or Replayed with a key) or claims once.
func (c *Client) Claim(ctx context.Context, req ClaimRequest) (cl ClaimResult, err error) {
	defer c.m.claimDone(ctx, opClaim, c.m.now(), &cl, &err)
	return c.claim(ctx, c.db, req)
}

// ClaimTx is Claim inside the caller's transaction: the voucher is the
// member's when tx commits. The unit or code stays locked by tx until it
// ends: other claimers of a counted pool wait for it; claimers of a sharded
// pool or a code campaign take other shards or codes meanwhile. With an
// idempotency key, a concurrent call with the same key waits for tx.
// Serialization failures and deadlocks are returned unchanged, as for
// GrantTx.
func (c *Client) ClaimTx(ctx context.Context, tx pgx.Tx, req ClaimRequest) (cl ClaimResult, err error) {
	defer c.m.claimDone(ctx, opClaimTx, c.m.now(), &cl, &err)
	return c.claim(ctx, tx, req)
}

func (c *Client) claim(ctx context.Context, x db.DBTX, req ClaimRequest) (ClaimResult, error) {
	fp, err := checkClaimRequest(req)
	if err != nil {
		return ClaimResult{}, err
	}
	pools := func() (ClaimResult, error) {
		if fp.key.Key != "" {
			return c.claimVoucherKeyed(ctx, x, fp)
		}
		return c.claimVoucher(ctx, x, fp.target, fp.member)
	}
	codes := func() (ClaimResult, error) {
		if fp.key.Key != "" {
			return c.claimCodeKeyed(ctx, x, fp)
		}
		return c.claimCode(ctx, x, fp.target, fp.member)
	}
	first, second := pools, codes
	_, isCodes := c.codeCampaigns.Load(fp.target)
	if isCodes {
		first, second = codes, pools
	}
	res, err := first()
	if !errors.Is(err, errOtherKind) {
		return res, err
	}
	// The campaign is of the other kind (or was recreated as one): nothing
	// was written; take the other path once.
	if isCodes {
		c.codeCampaigns.Delete(fp.target)
	} else {
		c.codeCampaigns.Store(fp.target, struct{}{})
	}
	res, err = second()
	if errors.Is(err, errOtherKind) {
		return ClaimResult{}, fmt.Errorf("pgquota: claim: campaign %q changed kind during the claim", fp.target)
	}
	return res, err
}
