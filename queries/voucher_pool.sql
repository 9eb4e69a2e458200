-- name: VoucherPoolCreate :one
-- Creates a campaign. No row comes back when it already exists.
INSERT INTO pgquota.voucher_pool (campaign, kind, total)
VALUES (@campaign::text, @kind::text, @total::bigint)
ON CONFLICT (campaign) DO NOTHING
RETURNING campaign, kind, total, claimed, created_at;

-- name: VoucherPoolGet :one
SELECT campaign, kind, total, claimed, created_at
FROM pgquota.voucher_pool
WHERE campaign = @campaign::text;

-- name: VoucherPoolStatus :one
-- A campaign's totals. For a counted pool claimed is the pool's counter; for
-- a sharded pool the sum of its shards' counters (shards is their number,
-- 0 for other kinds); for a code campaign the number of codes handed out.
SELECT p.campaign, p.kind, p.total,
       CASE p.kind
           WHEN 'counted' THEN p.claimed
           WHEN 'sharded' THEN (SELECT coalesce(sum(s.claimed), 0) FROM pgquota.voucher_shard s WHERE s.campaign = p.campaign)
           ELSE (SELECT count(*) FROM pgquota.voucher_claim c WHERE c.campaign = p.campaign)
       END::bigint AS claimed,
       (SELECT count(*) FROM pgquota.voucher_shard s WHERE s.campaign = p.campaign)::integer AS shards,
       p.created_at
FROM pgquota.voucher_pool p
WHERE p.campaign = @campaign::text;

-- name: VoucherPoolAddCodes :exec
UPDATE pgquota.voucher_pool
SET total = total + @added::bigint
WHERE campaign = @campaign::text;
