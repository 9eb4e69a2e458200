-- name: VoucherClaimCounted :one
-- Claims one unit of a counted pool for a member, in one statement.
--
-- pool locks the pool row with a locking read guarded by claimed < total.
-- Under READ COMMITTED a locking read waits for a concurrent claim to commit
-- and re-checks its WHERE clause against the newest version (the manual's
-- section 13.2.1), so once it returns a row this statement holds the lock on
-- a row that has room. The claim row is inserted next; its primary key
-- (campaign, member) turns a second claim by the same member into a no-op
-- (ON CONFLICT DO NOTHING), and only an inserted claim raises the counter.
-- The CHECK claimed <= total stays as a backstop. A sold-out pool is not
-- locked at all: its snapshot row already fails the guard.
--
-- The NOT EXISTS on the member's claim reads the statement's snapshot; it
-- only spares a member who already holds a unit from queueing on the pool
-- lock. It is not the guard: the primary key is.
--
-- One row comes back when the campaign exists. When no unit was handed out,
-- the member's earlier claim (if any) is read with a fresh snapshot, so a
-- double-click that lost the race still sees the first click's claim.
WITH pool AS (
    SELECT p.campaign, p.claimed
    FROM pgquota.voucher_pool p
    WHERE p.campaign = @campaign::text
      AND p.kind = 'counted'
      AND p.claimed < p.total
      AND NOT EXISTS (
          SELECT 1 FROM pgquota.voucher_claim c
          WHERE c.campaign = @campaign::text AND c.member = @member::text
      )
    FOR UPDATE OF p
), ins AS (
    INSERT INTO pgquota.voucher_claim (campaign, member, seq, claimed_at)
    SELECT pool.campaign, @member::text, pool.claimed + 1, pgquota.clock()
    FROM pool
    ON CONFLICT (campaign, member) DO NOTHING
    RETURNING seq, claimed_at
), upd AS (
    UPDATE pgquota.voucher_pool p
    SET claimed = p.claimed + 1
    FROM ins
    WHERE p.campaign = @campaign::text
    RETURNING p.claimed
), prior AS (
    SELECT f.seq, f.code, f.member, f.claimed_at
    FROM pgquota.voucher_claim_fresh(@campaign::text, @member::text) f
    WHERE NOT EXISTS (SELECT 1 FROM ins)
)
SELECT p.kind,
       p.total,
       coalesce((SELECT upd.claimed FROM upd), p.claimed)::bigint AS claimed,
       EXISTS (SELECT 1 FROM ins)::boolean AS claimed_now,
       coalesce((SELECT ins.seq FROM ins), (SELECT prior.seq FROM prior), 0)::bigint AS seq,
       coalesce((SELECT ins.claimed_at FROM ins), (SELECT prior.claimed_at FROM prior))::timestamptz AS claimed_at
FROM pgquota.voucher_pool p
WHERE p.campaign = @campaign::text
  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: VoucherClaimGet :one
SELECT campaign, member, seq, code, claimed_at
FROM pgquota.voucher_claim
WHERE campaign = @campaign::text AND member = @member::text;
