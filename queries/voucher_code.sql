-- name: VoucherCodeClaim :one
-- Hands one unclaimed code of a campaign to a member, in one statement.
--
-- pick takes one unclaimed code with FOR UPDATE SKIP LOCKED, so concurrent
-- claimers take different codes instead of queueing on the same one. The
-- claim row is inserted next; its primary key (campaign, member) makes a
-- member's second claim a no-op, and only an inserted claim marks the code.
--
-- When nothing was handed out, the member's earlier claim is read with a
-- fresh snapshot, and so is whether any unclaimed code is left: codes that
-- SKIP LOCKED passed over are held by claimers that may still roll back, so
-- the campaign is sold out only when no unclaimed code is left at all
-- (codes_left false). The caller retries while codes_left is true.
WITH pick AS (
    SELECT v.campaign, v.code
    FROM pgquota.voucher_code v
    WHERE v.campaign = @campaign::text
      AND v.member IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM pgquota.voucher_claim c
          WHERE c.campaign = @campaign::text AND c.member = @member::text
      )
    LIMIT 1
    FOR UPDATE OF v SKIP LOCKED
), ins AS (
    INSERT INTO pgquota.voucher_claim (campaign, member, code, claimed_at)
    SELECT pick.campaign, @member::text, pick.code, pgquota.clock()
    FROM pick
    ON CONFLICT (campaign, member) DO NOTHING
    RETURNING code, claimed_at
), upd AS (
    UPDATE pgquota.voucher_code v
    SET member = @member::text,
        claimed_at = ins.claimed_at
    FROM ins
    WHERE v.campaign = @campaign::text AND v.code = ins.code
    RETURNING v.code
), prior AS (
    SELECT f.seq, f.code, f.member, f.claimed_at
    FROM pgquota.voucher_claim_fresh(@campaign::text, @member::text) f
    WHERE NOT EXISTS (SELECT 1 FROM ins)
)
SELECT p.kind,
       p.total,
       EXISTS (SELECT 1 FROM upd)::boolean AS claimed_now,
       coalesce((SELECT ins.code FROM ins), (SELECT prior.code FROM prior), '')::text AS code,
       coalesce((SELECT ins.claimed_at FROM ins), (SELECT prior.claimed_at FROM prior))::timestamptz AS claimed_at,
       (NOT EXISTS (SELECT 1 FROM ins)
        AND NOT EXISTS (SELECT 1 FROM prior WHERE prior.member IS NOT NULL)
        AND pgquota.voucher_codes_left_fresh(@campaign::text))::boolean AS codes_left
FROM pgquota.voucher_pool p
WHERE p.campaign = @campaign::text;
