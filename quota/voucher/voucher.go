package voucher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/dbutil"
	"github.com/pgquota/pgquota/quota"
)

// CampaignKind tells how a campaign hands out vouchers.
type CampaignKind string

const (
	// KindCounted is a pool with a total: a claim takes one unit while
	// claimed < total. Created by CreateCampaign.
	KindCounted CampaignKind = "counted"
	// KindCodes is a set of pre-loaded distinct codes: a claim takes one
	// unclaimed code. Created by ImportCodes.
	KindCodes CampaignKind = "codes"
)

// Campaign is a voucher campaign and its totals.
type Campaign struct {
	Name string       `json:"campaign"`
	Kind CampaignKind `json:"kind"`
	// Total is the number of units (counted pool) or imported codes.
	Total int64 `json:"total"`
	// Claimed is the number of units or codes handed out.
	Claimed int64 `json:"claimed"`
	// Remaining is Total - Claimed.
	Remaining int64 `json:"remaining"`
	// SoldOut reports Remaining == 0.
	SoldOut bool `json:"sold_out"`
	// Shards is the number of shards of a sharded pool (KindSharded), 0
	// for other kinds.
	Shards    int       `json:"shards"`
	CreatedAt time.Time `json:"created_at"`
}

// ClaimResult is the outcome of a voucher claim. A sold-out campaign is a result
// (Claimed false), not an error.
type ClaimResult struct {
	Campaign string `json:"campaign"`
	Member   string `json:"member"`
	// Claimed reports whether the member holds a voucher of the campaign
	// after the call. False means sold out.
	Claimed bool `json:"claimed"`
	// Repeat reports that the member's voucher was claimed by an earlier
	// call; that first claim is what this result describes, and no second
	// unit was taken.
	Repeat bool `json:"repeat"`
	// Seq is the unit's number in a counted pool, 1 to Total; 0 for codes.
	Seq int64 `json:"seq"`
	// Code is the code handed out by a code campaign; "" for counted pools.
	Code      string    `json:"code"`
	ClaimedAt time.Time `json:"claimed_at"`
	// Total is the campaign's total (units, or imported codes).
	Total int64 `json:"total"`
	// Keyed is the ledger record of a claim made with an idempotency key
	// (ClaimRequest.Idempotency; Claim, ClaimTx).
	quota.Keyed
}

// ImportResult reports what ImportCodes did.
type ImportResult struct {
	Campaign string `json:"campaign"`
	// Imported is the number of new codes stored.
	Imported int64 `json:"imported"`
	// Duplicates is the number of codes skipped because they were already
	// in the campaign or repeated in the input.
	Duplicates int64 `json:"duplicates"`
	// Total is the campaign's number of codes after the import.
	Total int64 `json:"total"`
}

// CreateCampaign creates a counted voucher pool of total units. Creating
// a pool that exists with the same total returns it unchanged.
//
// Errors: *quota.InputError for a bad campaign or a total below 1;
// ErrCampaignExists when it exists with another total or as a code
// campaign; quota.ErrSchemaMissing; database errors.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call with the same total (a
// create that exists with it returns the pool).
func (c *Client) CreateCampaign(ctx context.Context, campaign string, total int64) (Campaign, error) {
	return c.createVoucherPool(ctx, c.core.DB, campaign, total)
}

// CreateCampaignTx is CreateCampaign inside the caller's transaction.
func (c *Client) CreateCampaignTx(ctx context.Context, tx pgx.Tx, campaign string, total int64) (Campaign, error) {
	return c.createVoucherPool(ctx, tx, campaign, total)
}

func (c *Client) createVoucherPool(ctx context.Context, x db.DBTX, campaign string, total int64) (Campaign, error) {
	if err := core.CheckName("campaign", campaign); err != nil {
		return Campaign{}, err
	}
	if err := core.CheckUnits("total", total, 1); err != nil {
		return Campaign{}, err
	}
	row, err := c.core.Queries.VoucherPoolCreate(ctx, x, db.VoucherPoolCreateParams{
		Campaign: campaign, Kind: string(KindCounted), Total: total,
	})
	if err == nil {
		return poolFromRow(row, row.Claimed), nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Campaign{}, core.DBError("create voucher pool", err)
	}
	existing, err := c.core.Queries.VoucherPoolGet(ctx, x, campaign)
	if err != nil {
		return Campaign{}, core.DBError("create voucher pool", err)
	}
	if CampaignKind(existing.Kind) != KindCounted || existing.Total != total {
		return Campaign{}, core.Errorf("%w: %q is a %s campaign with total %d", ErrCampaignExists, campaign, existing.Kind, existing.Total)
	}
	return poolFromRow(existing, existing.Claimed), nil
}

func poolFromRow(r db.PgquotaVoucherPool, claimed int64) Campaign {
	return Campaign{
		Name:      r.Campaign,
		Kind:      CampaignKind(r.Kind),
		Total:     r.Total,
		Claimed:   claimed,
		Remaining: max(r.Total-claimed, 0),
		SoldOut:   claimed >= r.Total,
		CreatedAt: core.TimeFromPG(r.CreatedAt),
	}
}

// Campaign returns a campaign's totals. For a sharded pool, Claimed is
// the sum of its shards' claimed units, read in one statement (one
// snapshot).
//
// Errors: *quota.InputError for a bad campaign; ErrCampaignNotFound;
// quota.ErrSchemaMissing; database errors.
func (c *Client) Campaign(ctx context.Context, campaign string) (Campaign, error) {
	if err := core.CheckName("campaign", campaign); err != nil {
		return Campaign{}, err
	}
	row, err := c.core.Queries.VoucherPoolStatus(ctx, c.core.DB.Reads(), campaign)
	if errors.Is(err, pgx.ErrNoRows) {
		return Campaign{}, core.Errorf("%w: %q", ErrCampaignNotFound, campaign)
	}
	if err != nil {
		return Campaign{}, core.DBError("voucher status", err)
	}
	return poolFromStatus(row), nil
}

// ErrCodesBusy is returned by Claim and ClaimTx on a code campaign when
// unclaimed codes remain but every one of them stayed locked by other claims
// in progress for longer than Config.CodeClaimWait (or the context's
// deadline). The campaign is not sold out; try again.
var ErrCodesBusy = errors.New("pgquota: every unclaimed code is locked by a claim in progress")

// errCodesLocked marks an attempt that found only locked codes; it is
// retried with backoff.
var errCodesLocked = errors.New("codes locked")

// whileCodesLocked runs a code claim attempt until it returns something
// else than errCodesLocked, with backoff, for up to Config.CodeClaimWait.
// attempt marks its final errors with backoff.Permanent.
func (c *Client) whileCodesLocked(ctx context.Context, campaign string, attempt func() (ClaimResult, error)) (ClaimResult, error) {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     2 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         100 * time.Millisecond,
	}
	claim, err := backoff.Retry(ctx, attempt,
		backoff.WithBackOff(b),
		backoff.WithMaxElapsedTime(c.cfg.CodeClaimWait))
	if errors.Is(err, errCodesLocked) {
		return ClaimResult{}, core.Errorf("%w (campaign %q)", ErrCodesBusy, campaign)
	}
	return claim, err
}

// ImportCodes adds codes to a code campaign, creating the campaign when it
// does not exist. The codes are sent as one array to
// pgquota.voucher_import_codes (an operator's function, migration 00022)
// and merged in one transaction, so thousands of codes take one round trip
// each way; codes already in the campaign, or repeated in codes, are
// skipped and counted. Every code is validated first: one bad code rejects
// the whole import and nothing is written.
//
// Errors: *quota.InputError for a bad campaign or code (naming its index), or an
// empty list; ErrCampaignExists when the campaign is a counted pool;
// quota.ErrPermissionDenied when the role is not a member of pgquota_operator;
// quota.ErrSchemaMissing; database errors.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call with the same codes (codes
// already in the campaign are skipped).
func (c *Client) ImportCodes(ctx context.Context, campaign string, codes []string) (ImportResult, error) {
	if err := checkImport(campaign, codes); err != nil {
		return ImportResult{}, err
	}
	return core.Retry(ctx, c.core.Policy, func() (ImportResult, error) {
		return dbutil.WithTxResult(ctx, c.core.Pool, func(tx pgx.Tx) (ImportResult, error) {
			return c.importCodes(ctx, tx, campaign, codes)
		})
	})
}

// ImportCodesTx is ImportCodes inside the caller's transaction.
func (c *Client) ImportCodesTx(ctx context.Context, tx pgx.Tx, campaign string, codes []string) (ImportResult, error) {
	if err := checkImport(campaign, codes); err != nil {
		return ImportResult{}, err
	}
	return c.importCodes(ctx, tx, campaign, codes)
}

func checkImport(campaign string, codes []string) error {
	if err := core.CheckName("campaign", campaign); err != nil {
		return err
	}
	if len(codes) == 0 {
		return core.Invalid("codes", "the list is empty")
	}
	for i, code := range codes {
		if err := core.CheckName(fmt.Sprintf("code %d", i+1), code); err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) importCodes(ctx context.Context, tx pgx.Tx, campaign string, codes []string) (ImportResult, error) {
	pool, err := c.core.Queries.VoucherPoolCreate(ctx, tx, db.VoucherPoolCreateParams{
		Campaign: campaign, Kind: string(KindCodes), Total: 0,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		pool, err = c.core.Queries.VoucherPoolGet(ctx, tx, campaign)
	}
	if err != nil {
		return ImportResult{}, core.DBError("import codes", err)
	}
	if CampaignKind(pool.Kind) != KindCodes {
		return ImportResult{}, core.Errorf("%w: %q is a %s pool, it cannot hold codes", ErrCampaignExists, campaign, pool.Kind)
	}
	// pgquota.voucher_import_codes (migrations/00022, SECURITY DEFINER)
	// inserts the codes in code order: concurrent imports with overlapping
	// codes then wait for each other's rows in the same order and cannot
	// deadlock (unordered, a hash aggregate's order differs with the size
	// of the input, and they did).
	var imported, total int64
	err = tx.QueryRow(ctx, `SELECT r.imported, r.total FROM pgquota.voucher_import_codes($1::text, $2::text[]) r`,
		campaign, codes).Scan(&imported, &total)
	if err != nil {
		return ImportResult{}, core.DBError("import codes", err)
	}
	return ImportResult{
		Campaign:   campaign,
		Imported:   imported,
		Duplicates: int64(len(codes)) - imported,
		Total:      total,
	}, nil
}
