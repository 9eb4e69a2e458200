-- name: VoucherShardCreate :exec
-- Creates the shards of a sharded pool: shard @shards[i] holds @totals[i]
-- units numbered @bases[i] + 1 .. @bases[i] + @totals[i] (quota/shard.go
-- computes the split).
INSERT INTO pgquota.voucher_shard (campaign, shard, base, total)
SELECT @campaign::text,
       unnest(@shards::integer[]),
       unnest(@bases::bigint[]),
       unnest(@totals::bigint[]);

-- name: VoucherShardCount :one
SELECT count(*)::integer AS shards
FROM pgquota.voucher_shard
WHERE campaign = @campaign::text;

-- name: VoucherShardClaim :one
-- Claims one unit of a sharded pool for a member, in one statement.
--
-- pick locks one shard with room (claimed < total), trying the shards from
-- @start on, then those before it, so that concurrent claimers starting at
-- random shards lock different rows:
--   * first with FOR UPDATE SKIP LOCKED (skip_from, then skip_before): a
--     claimer whose shard is empty or locked moves on to the next one,
--     without waiting;
--   * only when every shard with room is locked by another claim in
--     progress, without SKIP LOCKED (wait_from, then wait_before): the
--     claim waits for the lock of the first shard that had room in the
--     statement's snapshot. When the claim holding it commits, the locking
--     read re-checks claimed < total on the newest version and moves on to
--     the next shard if it is full now; when that claim rolls back, the
--     shard keeps its room and is taken.
-- Each part walks the primary key from its first shard and stops at the
-- first row it locks, and runs only when the parts before it locked
-- nothing: a claim reads few shard rows, which also keeps claims from
-- conflicting with each other's reads under SERIALIZABLE.
--
-- A locking read re-checks claimed < total against the newest version of a
-- shard that changed since the statement's snapshot (the manual, section
-- 13.2.1) and returns that version, so the unit number base + claimed + 1
-- is the shard's next free unit. The claim row is inserted next; its
-- primary key (campaign, member) makes a member's second claim a no-op, and
-- only an inserted claim raises the shard's counter. The CHECK claimed <=
-- total stays as a backstop.
--
-- A shard without room in the snapshot never gets one back (units are never
-- returned to a sharded pool), so when pick returns nothing every shard is
-- full: the pool is sold out. When nothing was handed out, the member's
-- earlier claim is read with a fresh snapshot, and so is whether any shard
-- still has units (units_left, a consistency check: false whenever the
-- reasoning above holds).
WITH held AS (
    SELECT EXISTS (
        SELECT 1 FROM pgquota.voucher_claim c
        WHERE c.campaign = @campaign::text AND c.member = @member::text
    ) AS yes
), skip_from AS (
    SELECT s.campaign, s.shard, s.base, s.claimed
    FROM pgquota.voucher_shard s
    WHERE s.campaign = @campaign::text
      AND s.shard >= @start::integer
      AND s.claimed < s.total
      AND NOT (SELECT yes FROM held)
    ORDER BY s.shard
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
), skip_before AS (
    SELECT s.campaign, s.shard, s.base, s.claimed
    FROM pgquota.voucher_shard s
    WHERE s.campaign = @campaign::text
      AND s.shard < @start::integer
      AND s.claimed < s.total
      AND NOT (SELECT yes FROM held)
      AND NOT EXISTS (SELECT 1 FROM skip_from)
    ORDER BY s.shard
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
), wait_from AS (
    SELECT s.campaign, s.shard, s.base, s.claimed
    FROM pgquota.voucher_shard s
    WHERE s.campaign = @campaign::text
      AND s.shard >= @start::integer
      AND s.claimed < s.total
      AND NOT (SELECT yes FROM held)
      AND NOT EXISTS (SELECT 1 FROM skip_from)
      AND NOT EXISTS (SELECT 1 FROM skip_before)
    ORDER BY s.shard
    LIMIT 1
    FOR UPDATE OF s
), wait_before AS (
    SELECT s.campaign, s.shard, s.base, s.claimed
    FROM pgquota.voucher_shard s
    WHERE s.campaign = @campaign::text
      AND s.shard < @start::integer
      AND s.claimed < s.total
      AND NOT (SELECT yes FROM held)
      AND NOT EXISTS (SELECT 1 FROM skip_from)
      AND NOT EXISTS (SELECT 1 FROM skip_before)
      AND NOT EXISTS (SELECT 1 FROM wait_from)
    ORDER BY s.shard
    LIMIT 1
    FOR UPDATE OF s
), pick AS (
    SELECT * FROM skip_from
    UNION ALL
    SELECT * FROM skip_before
    UNION ALL
    SELECT * FROM wait_from
    UNION ALL
    SELECT * FROM wait_before
), ins AS (
    INSERT INTO pgquota.voucher_claim (campaign, member, seq, claimed_at)
    SELECT pick.campaign, @member::text, pick.base + pick.claimed + 1, pgquota.clock()
    FROM pick
    ON CONFLICT (campaign, member) DO NOTHING
    RETURNING seq, claimed_at
), upd AS (
    UPDATE pgquota.voucher_shard s
    SET claimed = s.claimed + 1
    FROM pick, ins
    WHERE s.campaign = pick.campaign AND s.shard = pick.shard
    RETURNING s.shard
), prior AS (
    SELECT f.seq, f.code, f.member, f.claimed_at
    FROM pgquota.voucher_claim_fresh(@campaign::text, @member::text) f
    WHERE NOT EXISTS (SELECT 1 FROM ins)
)
SELECT p.kind,
       p.total,
       EXISTS (SELECT 1 FROM upd)::boolean AS claimed_now,
       coalesce((SELECT ins.seq FROM ins), (SELECT prior.seq FROM prior), 0)::bigint AS seq,
       coalesce((SELECT ins.claimed_at FROM ins), (SELECT prior.claimed_at FROM prior))::timestamptz AS claimed_at,
       (NOT EXISTS (SELECT 1 FROM ins)
        AND NOT EXISTS (SELECT 1 FROM prior WHERE prior.member IS NOT NULL)
        AND p.kind = 'sharded'
        AND pgquota.voucher_shards_left_fresh(@campaign::text))::boolean AS units_left
FROM pgquota.voucher_pool p
WHERE p.campaign = @campaign::text
  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: LedgerClaimShard :one
-- VoucherShardClaim with a ledger row (ClaimVoucherWithKey on a sharded
-- pool), built as ledger.sql's keyed statements are: the ledger key is
-- inserted first (ON CONFLICT DO NOTHING), every write selects FROM that
-- insert, and the outcome is stored by the same statement. The shard is
-- locked after the key. Its pick waits (no SKIP LOCKED part), and returns
-- nothing only when every shard is full, so a stored sold-out outcome is
-- exact. A member who already holds a unit, and a sold-out pool, are
-- outcomes too, stored and replayed. The outcome's used is 0: a sharded
-- pool has no single claimed counter.
WITH camp AS (
    SELECT p.campaign, p.kind, p.total, pgquota.clock() AS at
    FROM pgquota.voucher_pool p
    WHERE p.campaign = @campaign::text
), led AS (
    INSERT INTO pgquota.ledger (scope, idempotency_key, operation, target, member, amount, created_at)
    SELECT @scope::text, @idempotency_key::text, 'claim', camp.campaign, @member::text, 1, camp.at
    FROM camp
    WHERE camp.kind = 'sharded'
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING grant_id
), held AS (
    SELECT EXISTS (
        SELECT 1 FROM pgquota.voucher_claim c
        WHERE c.campaign = @campaign::text AND c.member = @member::text
    ) AS yes
), pick_from AS (
    SELECT s.campaign, s.shard, s.base, s.claimed
    FROM pgquota.voucher_shard s
    CROSS JOIN led
    WHERE s.campaign = @campaign::text
      AND s.shard >= @start::integer
      AND s.claimed < s.total
      AND NOT (SELECT yes FROM held)
    ORDER BY s.shard
    LIMIT 1
    FOR UPDATE OF s
), pick_before AS (
    SELECT s.campaign, s.shard, s.base, s.claimed
    FROM pgquota.voucher_shard s
    CROSS JOIN led
    WHERE s.campaign = @campaign::text
      AND s.shard < @start::integer
      AND s.claimed < s.total
      AND NOT (SELECT yes FROM held)
      AND NOT EXISTS (SELECT 1 FROM pick_from)
    ORDER BY s.shard
    LIMIT 1
    FOR UPDATE OF s
), pick AS (
    SELECT * FROM pick_from
    UNION ALL
    SELECT * FROM pick_before
), ins AS (
    INSERT INTO pgquota.voucher_claim (campaign, member, seq, claimed_at)
    SELECT pick.campaign, @member::text, pick.base + pick.claimed + 1, pgquota.clock()
    FROM pick
    ON CONFLICT (campaign, member) DO NOTHING
    RETURNING seq, claimed_at
), upd AS (
    UPDATE pgquota.voucher_shard s
    SET claimed = s.claimed + 1
    FROM pick, ins
    WHERE s.campaign = pick.campaign AND s.shard = pick.shard
    RETURNING s.shard
), prior AS (
    SELECT f.seq, f.claimed_at
    FROM pgquota.voucher_claim_fresh(@campaign::text, @member::text) f
    WHERE EXISTS (SELECT 1 FROM led)
      AND NOT EXISTS (SELECT 1 FROM ins)
      AND f.member IS NOT NULL
), res AS (
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, limit_value, seq, repeat, claimed_at, decided_at)
    SELECT led.grant_id,
           ins.seq IS NOT NULL OR prior.seq IS NOT NULL,
           0,
           camp.total,
           coalesce(ins.seq, prior.seq, 0),
           ins.seq IS NULL AND prior.seq IS NOT NULL,
           coalesce(ins.claimed_at, prior.claimed_at),
           camp.at
    FROM led
    CROSS JOIN camp
    LEFT JOIN ins ON true
    LEFT JOIN prior ON true
    RETURNING grant_id, granted, seq, repeat, claimed_at
)
SELECT (camp.campaign IS NOT NULL)::boolean AS campaign_found,
       coalesce(camp.kind, '')::text AS kind,
       coalesce(camp.total, 0)::bigint AS total,
       coalesce(res.grant_id, 0)::bigint AS grant_id,
       coalesce(res.granted, false)::boolean AS claimed,
       coalesce(res.seq, 0)::bigint AS seq,
       coalesce(res.repeat, false)::boolean AS repeat,
       res.claimed_at::timestamptz AS claimed_at,
       (CASE WHEN res.grant_id IS NULL
             THEN pgquota.ledger_key_fresh(@scope::text, @idempotency_key::text)
             ELSE 0 END)::bigint AS prior_grant_id
FROM (SELECT 1) one
LEFT JOIN camp ON true
LEFT JOIN res ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');
