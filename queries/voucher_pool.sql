-- name: VoucherPoolCreate :one
-- Creates a campaign. No row comes back when it already exists.
-- The statement is pgquota.voucher_pool_create (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT * FROM pgquota.voucher_pool_create(@campaign::text, @kind::text, @total::bigint);

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
-- The statement is pgquota.voucher_pool_add_codes (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.voucher_pool_add_codes(@added::bigint, @campaign::text);
