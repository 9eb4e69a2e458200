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
-- a code campaign it is the number of codes handed out.
SELECT p.campaign, p.kind, p.total,
       CASE p.kind
           WHEN 'counted' THEN p.claimed
           ELSE (SELECT count(*) FROM pgquota.voucher_claim c WHERE c.campaign = p.campaign)
       END::bigint AS claimed,
       p.created_at
FROM pgquota.voucher_pool p
WHERE p.campaign = @campaign::text;

-- name: VoucherPoolAddCodes :exec
UPDATE pgquota.voucher_pool
SET total = total + @added::bigint
WHERE campaign = @campaign::text;
