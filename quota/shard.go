package quota

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/dbutil"
)

// Sharded voucher pools.
//
// A counted pool is one row: every claim locks it until its commit is
// flushed, so claims queue one flush after another. A sharded pool splits
// its total across K rows (pgquota.voucher_shard) and a claim takes a unit
// from one of them, so up to K claims proceed at once; PostgreSQL's group
// commit then flushes their commits together. Splitting a hot counter into
// sub-counters is an old remedy for hot spots (Gawlick and Kinkade, "Varieties
// of concurrency control in IMS/VS Fast Path", 1985; the "sharded counter"
// pattern). The total stays exact because each shard row has its own
// guard (claimed < total, re-checked on the newest version) and the shard
// totals add up to the pool's. No unit is stranded: a claim moves on from an
// empty or locked shard to the others, and reports sold out only when every
// shard is full (see queries/voucher_shard.sql).

// KindSharded is a counted pool whose total is split across shards:
// created by CreateShardedCampaign, claimed with Claim.
const KindSharded CampaignKind = "sharded"

// MaxShards is the largest number of shards of a sharded pool.
const MaxShards = 1024

// CreateShardedCampaign creates a voucher pool of total units split across
// shards rows (shards between 1 and MaxShards, and at most total): the
// first total % shards shards hold one unit more than the others. A pool is
// claimed with Claim, like a counted pool, and reports its totals
// with Campaign (the sum of its shards). Unit numbers (ClaimResult.Seq) run
// from 1 to total, each shard holding a consecutive range. Creating a pool
// that exists with the same total and shards returns it unchanged.
//
// Errors: *InputError for a bad campaign, a total below 1, or a number of
// shards out of range; ErrCampaignExists when the campaign exists with
// another total, number of shards or kind; ErrSchemaMissing; database
// errors. Serialization failures and deadlocks are retried as for Grant.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call with the same total and
// shards.
func (c *Client) CreateShardedCampaign(ctx context.Context, campaign string, total int64, shards int) (Campaign, error) {
	if err := checkShardedPool(campaign, total, shards); err != nil {
		return Campaign{}, err
	}
	return retry(ctx, c.policy, func() (Campaign, error) {
		return dbutil.WithTxResult(ctx, c.pool, func(tx pgx.Tx) (Campaign, error) {
			return c.createShardedPool(ctx, tx, campaign, total, shards)
		})
	})
}

// CreateShardedCampaignTx is CreateShardedCampaign inside the caller's
// transaction.
func (c *Client) CreateShardedCampaignTx(ctx context.Context, tx pgx.Tx, campaign string, total int64, shards int) (Campaign, error) {
	if err := checkShardedPool(campaign, total, shards); err != nil {
		return Campaign{}, err
	}
	return c.createShardedPool(ctx, tx, campaign, total, shards)
}

func checkShardedPool(campaign string, total int64, shards int) error {
	if err := checkName("campaign", campaign); err != nil {
		return err
	}
	if err := checkUnits("total", total, 1); err != nil {
		return err
	}
	if shards < 1 || shards > MaxShards {
		return inputError("shards", "must be between 1 and %d, got %d", MaxShards, shards)
	}
	if int64(shards) > total {
		return inputError("shards", "must be at most the total (%d), got %d: every shard holds at least one unit", total, shards)
	}
	return nil
}

// shardSplit returns the shards' numbers, first unit numbers minus one,
// and totals for total units in n shards.
func shardSplit(total int64, n int) (ids []int32, bases, totals []int64) {
	per, extra := total/int64(n), total%int64(n)
	var base int64
	for i := range n {
		t := per
		if int64(i) < extra {
			t++
		}
		ids = append(ids, int32(i))
		bases = append(bases, base)
		totals = append(totals, t)
		base += t
	}
	return ids, bases, totals
}

func (c *Client) createShardedPool(ctx context.Context, tx pgx.Tx, campaign string, total int64, shards int) (Campaign, error) {
	row, err := c.queries.VoucherPoolCreate(ctx, tx, db.VoucherPoolCreateParams{
		Campaign: campaign, Kind: string(KindSharded), Total: total,
	})
	if isNoRows(err) {
		existing, err := c.queries.VoucherPoolStatus(ctx, tx, campaign)
		if err != nil {
			return Campaign{}, dbError("create sharded pool", err)
		}
		if CampaignKind(existing.Kind) != KindSharded || existing.Total != total || int(existing.Shards) != shards {
			return Campaign{}, fmt.Errorf("%w: %q is a %s campaign with total %d in %d shards", ErrCampaignExists, campaign, existing.Kind, existing.Total, existing.Shards)
		}
		return poolFromStatus(existing), nil
	}
	if err != nil {
		return Campaign{}, dbError("create sharded pool", err)
	}
	ids, bases, totals := shardSplit(total, shards)
	err = c.queries.VoucherShardCreate(ctx, tx, db.VoucherShardCreateParams{
		Campaign: campaign, Shards: ids, Bases: bases, Totals: totals,
	})
	if err != nil {
		return Campaign{}, dbError("create sharded pool", err)
	}
	p := poolFromRow(row, 0)
	p.Shards = shards
	return p, nil
}

// poolFromStatus converts a VoucherPoolStatus row.
func poolFromStatus(r db.VoucherPoolStatusRow) Campaign {
	p := poolFromRow(db.PgquotaVoucherPool{
		Campaign: r.Campaign, Kind: r.Kind, Total: r.Total, CreatedAt: r.CreatedAt,
	}, r.Claimed)
	p.Shards = int(r.Shards)
	return p
}

// shardCount returns the number of shards of a sharded pool, cached per
// client (a pool's shards never change).
func (c *Client) shardCount(ctx context.Context, x db.DBTX, campaign string) (int, error) {
	if n, ok := c.shardCounts.Load(campaign); ok {
		return n.(int), nil
	}
	n, err := c.queries.VoucherShardCount(ctx, x, campaign)
	if err != nil {
		return 0, dbError("claim voucher", err)
	}
	if n > 0 {
		c.shardCounts.Store(campaign, int(n))
	}
	return int(n), nil
}

// claimSharded claims a unit of a sharded pool of shards shards. kind is
// the campaign's kind: when it is not KindSharded, nothing was claimed.
func (c *Client) claimSharded(ctx context.Context, x db.DBTX, campaign, member string, shards int) (claim ClaimResult, kind CampaignKind, err error) {
	claim1 := func(x db.DBTX) (db.VoucherShardClaimRow, error) {
		start := int32(rand.IntN(max(shards, 1)))
		return c.queries.VoucherShardClaim(ctx, x, db.VoucherShardClaimParams{Campaign: campaign, Member: member, Start: start})
	}
	var row db.VoucherShardClaimRow
	if rp, own := x.(retryPool); own {
		// Each attempt passes the gate on its own: a claim that must run
		// again (a serialization failure) gives its place up while it
		// backs off, instead of retrying ahead of the claims waiting.
		row, err = retry(ctx, rp.policy, func() (db.VoucherShardClaimRow, error) {
			release, err := c.shardGate(ctx, campaign, shards)
			if err != nil {
				return db.VoucherShardClaimRow{}, err
			}
			defer release()
			return claim1(rp.pool)
		})
	} else {
		row, err = claim1(x)
	}
	if isNoRows(err) {
		return ClaimResult{}, "", fmt.Errorf("%w: %q", ErrCampaignNotFound, campaign)
	}
	if err != nil {
		return ClaimResult{}, "", dbError("claim voucher", err)
	}
	if CampaignKind(row.Kind) != KindSharded {
		return ClaimResult{}, CampaignKind(row.Kind), nil
	}
	if row.UnitsLeft {
		// The statement found every shard full, but a fresh read saw room:
		// impossible while units are never given back to a sharded pool.
		// Report it rather than "sold out".
		return ClaimResult{}, "", fmt.Errorf("pgquota: claim voucher: %q still has units after every shard was found full", campaign)
	}
	return ClaimResult{
		Campaign:  campaign,
		Member:    member,
		Claimed:   row.Seq > 0,
		Repeat:    row.Seq > 0 && !row.ClaimedNow,
		Seq:       row.Seq,
		ClaimedAt: timeFromPG(row.ClaimedAt),
		Total:     row.Total,
	}, KindSharded, nil
}

// errShardedPool tells claimVoucherKeyed that the campaign is a sharded
// pool: the counted pool's keyed statement wrote nothing.
var errShardedPool = errors.New("sharded pool")

// claimShardedKeyed is Claim on a sharded pool: one
// statement (LedgerClaimShard) that records the key, waits for a shard with
// units left if all of them are locked, and stores the outcome.
func (c *Client) claimShardedKeyed(ctx context.Context, x db.DBTX, campaign, member string, fp request) (ClaimResult, error) {
	n, err := c.shardCount(ctx, x, campaign)
	if err != nil {
		return ClaimResult{}, err
	}
	key := fp.key
	return runKeyed(ctx, c, x, fp, func() (ClaimResult, int64, error) {
		row, err := c.queries.LedgerClaimShard(ctx, x, db.LedgerClaimShardParams{
			Scope: key.Scope, IdempotencyKey: key.Key, Campaign: campaign, Member: member,
			Start: int32(rand.IntN(max(n, 1))),
		})
		switch {
		case err != nil:
			return ClaimResult{}, 0, dbError("claim voucher", err)
		case row.PriorGrantID != 0:
			return ClaimResult{}, row.PriorGrantID, nil
		case !row.CampaignFound:
			return ClaimResult{}, 0, fmt.Errorf("%w: %q", ErrCampaignNotFound, campaign)
		case CampaignKind(row.Kind) != KindSharded:
			c.shardCounts.Delete(campaign)
			return ClaimResult{}, 0, fmt.Errorf("pgquota: claim voucher: campaign %q changed kind during the claim", campaign)
		}
		return ClaimResult{
			Campaign:  campaign,
			Member:    member,
			Claimed:   row.Claimed,
			Repeat:    row.Repeat,
			Seq:       row.Seq,
			ClaimedAt: timeFromPG(row.ClaimedAt),
			Total:     row.Total,
			Keyed:     Keyed{GrantID: row.GrantID, IdempotencyScope: key.Scope, IdempotencyKey: key.Key},
		}, 0, nil
	}, claimFromEntry)
}

// shardGateMaxWait bounds how long a claim waits for the shard gate. A
// claim admitted by the gate may itself wait in the database, for a shard
// or a claim row that an open transaction of the application holds, for as
// long as that transaction lasts; the gate's waiters then go ahead after
// shardGateMaxWait without a place, so they are never held up for longer
// and the gate can never close a wait cycle with the application's
// transactions. In steady state a place frees every few milliseconds.
const shardGateMaxWait = 100 * time.Millisecond

// shardGate is one sharded pool's gate: a slot per claim allowed in
// flight, for a pool of shards shards.
type shardGate struct {
	slots  chan struct{}
	shards int
}

// shardGate admits one of this client's claims on a sharded pool of shards
// shards, holding at most half as many claims in flight as the pool has
// shards, and returns the function that lets the next one in. A claim
// holds its shard's row lock until its commit is flushed; with at most half
// the shards locked at a time, FOR UPDATE SKIP LOCKED almost always finds a
// free shard, where more claimers in flight than shards would wait in the
// shards' lock queues, which costs the server far more than a queue in
// this process. A claim that waits shardGateMaxWait goes ahead without a
// place. It bounds one client's claims only; see
// Config.ShardedClaimsInFlight.
func (c *Client) shardGate(ctx context.Context, campaign string, shards int) (func(), error) {
	n := c.cfg.ShardedClaimsInFlight
	if n < 0 {
		return func() {}, nil
	}
	if n == 0 {
		n = max(shards/2, 1)
	}
	v, ok := c.shardGates.Load(campaign)
	if !ok || v.(*shardGate).shards != shards {
		// First claim, or the campaign was recreated with another number
		// of shards: a gate of the new size. Claims still in flight on the
		// old one release their places there.
		fresh := &shardGate{slots: make(chan struct{}, n), shards: shards}
		if ok {
			c.shardGates.CompareAndSwap(campaign, v, fresh)
		} else {
			c.shardGates.LoadOrStore(campaign, fresh)
		}
		if v, ok = c.shardGates.Load(campaign); !ok {
			v = fresh // evicted meanwhile (campaign_cache.go)
		}
	}
	gate := v.(*shardGate)
	release := func() { <-gate.slots }
	select {
	case gate.slots <- struct{}{}:
		return release, nil
	default:
	}
	wait := shardGateMaxWait
	if c.testShardGateMaxWait > 0 {
		wait = c.testShardGateMaxWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case gate.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return func() {}, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
