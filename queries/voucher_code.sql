-- name: VoucherCodeClaim :one
-- Hands one unclaimed code of a campaign to a member, in one statement.
--
-- pick takes one unclaimed code with FOR UPDATE SKIP LOCKED, so concurrent
-- claimers take different codes instead of queueing on the same one. The
-- claim row is inserted next; its primary key (campaign, member) makes a
-- member's second claim a no-op, and only an inserted claim marks the code.
--
-- When nothing was handed out, the member's claim and whether any
-- unclaimed code is left are read together, with ONE fresh snapshot
-- (pgquota.voucher_code_state_fresh): codes that SKIP LOCKED passed over
-- are held by claimers that may still roll back, so the campaign is sold
-- out only when no unclaimed code is left at all (codes_left false). One
-- snapshot for both matters when the claimer holding the last code is a
-- copy of this very claim (same member): it committed before that
-- snapshot (its code is the member's) or not (the code is unclaimed).
-- Read one after the other, its commit could fall between the two reads
-- and the member be told the campaign is sold out. The caller retries
-- while codes_left is true.
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
    SELECT f.held_code AS code, f.held_since AS claimed_at, f.codes_left
    FROM pgquota.voucher_code_state_fresh(@campaign::text, @member::text) AS f (held_code, held_since, codes_left)
    WHERE NOT EXISTS (SELECT 1 FROM ins)
)
SELECT p.kind,
       p.total,
       EXISTS (SELECT 1 FROM upd)::boolean AS claimed_now,
       coalesce((SELECT ins.code FROM ins), (SELECT prior.code FROM prior), '')::text AS code,
       coalesce((SELECT ins.claimed_at FROM ins), (SELECT prior.claimed_at FROM prior))::timestamptz AS claimed_at,
       coalesce((SELECT prior.code IS NULL AND prior.codes_left FROM prior), false)::boolean AS codes_left
FROM pgquota.voucher_pool p
WHERE p.campaign = @campaign::text
  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');
