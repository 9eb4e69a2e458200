package voucher

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
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
// shard is full (see pgquota.claim_sharded, migrations/00015_sql_claims.sql).

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
// Errors: *quota.InputError for a bad campaign, a total below 1, or a number of
// shards out of range; ErrCampaignExists when the campaign exists with
// another total, number of shards or kind; quota.ErrSchemaMissing; database
// errors. Serialization failures and deadlocks are retried as for quota.Client.Grant.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call with the same total and
// shards.
func (c *Client) CreateShardedCampaign(ctx context.Context, campaign string, total int64, shards int) (Campaign, error) {
	if err := checkShardedPool(campaign, total, shards); err != nil {
		return Campaign{}, err
	}
	return core.Retry(ctx, c.core.Policy, func() (Campaign, error) {
		return dbutil.WithTxResult(ctx, c.core.Pool, func(tx pgx.Tx) (Campaign, error) {
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
	if err := core.CheckName("campaign", campaign); err != nil {
		return err
	}
	if err := core.CheckUnits("total", total, 1); err != nil {
		return err
	}
	if shards < 1 || shards > MaxShards {
		return core.Invalid("shards", "must be between 1 and %d, got %d", MaxShards, shards)
	}
	if int64(shards) > total {
		return core.Invalid("shards", "must be at most the total (%d), got %d: every shard holds at least one unit", total, shards)
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
	row, err := c.core.Queries.VoucherPoolCreate(ctx, tx, db.VoucherPoolCreateParams{
		Campaign: campaign, Kind: string(KindSharded), Total: total,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		existing, err := c.core.Queries.VoucherPoolStatus(ctx, tx, campaign)
		if err != nil {
			return Campaign{}, core.DBError("create sharded pool", err)
		}
		if CampaignKind(existing.Kind) != KindSharded || existing.Total != total || int(existing.Shards) != shards {
			return Campaign{}, core.Errorf("%w: %q is a %s campaign with total %d in %d shards", ErrCampaignExists, campaign, existing.Kind, existing.Total, existing.Shards)
		}
		return poolFromStatus(existing), nil
	}
	if err != nil {
		return Campaign{}, core.DBError("create sharded pool", err)
	}
	ids, bases, totals := shardSplit(total, shards)
	err = c.core.Queries.VoucherShardCreate(ctx, tx, db.VoucherShardCreateParams{
		Campaign: campaign, Shards: ids, Bases: bases, Totals: totals,
	})
	if err != nil {
		return Campaign{}, core.DBError("create sharded pool", err)
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
