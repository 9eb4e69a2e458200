-- Keyed operations: a grant, revoke or voucher claim that carries an
-- idempotency key, written together with its ledger row in ONE statement.
--
-- How every keyed statement below is built, and why it is exact:
--
--   1. led inserts the ledger row (scope, key, request) with ON CONFLICT
--      (scope, idempotency_key) DO NOTHING and RETURNING grant_id. When a
--      concurrent transaction has inserted the same key and not committed
--      yet, the insert waits for it; if it commits, the insert does nothing,
--      if it rolls back, the insert goes ahead. INSERT ON CONFLICT guarantees
--      this atomic "insert or do nothing" outcome under concurrency (the
--      PostgreSQL manual, INSERT, "ON CONFLICT Clause"). So of any number of
--      copies of one key, exactly one gets a row back from led, at any time.
--   2. Every write of the operation (the counter update or insert, the
--      voucher claim) selects FROM led. A copy whose led returned nothing
--      changes nothing: the write and the ledger row cannot be split,
--      because they are the same statement, and one statement commits or
--      rolls back as a whole. The guards of the write itself stay in the
--      WHERE clause of the row being written, exactly as in the keyless
--      statements (usage.sql, voucher_claim.sql, voucher_code.sql), and are
--      re-checked on the newest row version under READ COMMITTED (section
--      13.2.1).
--   3. The outcome row (ledger_outcome) is inserted by the same statement,
--      FROM led and the write's RETURNING, so the stored outcome is the
--      outcome of the write. (The statement cannot update the ledger row it
--      inserted, hence the second table.)
--   4. When led returned nothing, prior_grant_id is the key's grant id read
--      with a fresh snapshot (pgquota.ledger_key_fresh): the copy that won
--      committed while this statement waited, after this statement's
--      snapshot was taken. The caller then reads that entry, compares its
--      request with its own (same request: replay the stored outcome;
--      another request: ErrIdempotencyKeyReused) and writes nothing.
--
-- Locks are always taken in the same order: the ledger key first, then the
-- counter or pool row (the writes wait for led), so two keyed statements
-- cannot deadlock each other. Under REPEATABLE READ or SERIALIZABLE, an
-- insert that meets a key committed after the transaction's snapshot fails
-- with SQLSTATE 40001 instead of doing nothing; the statement is retried (by
-- pgquota when it owns the transaction, by the caller's RunInTx otherwise)
-- and then sees the key.
--
-- Every statement returns exactly one row, also when the quota or campaign
-- does not exist (a stored outcome is replayed even then).
--
-- The keyed grant and revoke (LedgerGrant, LedgerRevoke) take these steps
-- in order inside the PL/pgSQL functions pgquota.grant_keyed and
-- pgquota.revoke_keyed (migrations/00014): one call, so still one
-- statement; the write is the same code as the keyless grant's and
-- revoke's, and the later statements of the function see the rows the
-- earlier ones wrote.

-- name: LedgerGrant :one
-- UsageGrant (usage.sql) with a ledger row: pgquota.grant_keyed
-- (migrations/00014) inserts the ledger row first, then runs the same
-- counter write as pgquota.grant, then stores the outcome, as steps 1 to 4
-- above describe. The ledger row is written only when the quota exists, is
-- a calendar quota and a limit applies; otherwise nothing is written and
-- the caller reports ErrQuotaNotFound, ErrInvalidInput (kind rate, fixed or
-- rolling) or ErrNoLimit (unless the key was used before: then its stored
-- outcome is replayed).
SELECT g.found::boolean AS quota_found,
       coalesce(g.kind, '')::text AS kind,
       g.has_limit::boolean AS has_limit,
       g.limit_value::bigint AS limit_value,
       g.window_start::timestamptz AS window_start,
       g.window_end::timestamptz AS window_end,
       g.grant_id::bigint AS grant_id,
       g.granted::boolean AS granted,
       g.used::bigint AS used,
       g.prior_grant_id::bigint AS prior_grant_id,
       g.retry_after_us::bigint AS retry_after_us,
       g.reset_after_us::bigint AS reset_after_us,
       g.decided_at::timestamptz AS decided_at
FROM pgquota.grant_keyed(@scope::text, @idempotency_key::text, @quota_name::text, @member::text,
                         @amount::bigint, sqlc.narg('limit_value')::bigint) g;

-- name: LedgerRevoke :one
-- UsageRevoke (usage.sql) with a ledger row: pgquota.revoke_keyed
-- (migrations/00014) gives back up to @amount units of the member's counter
-- in the current window, never below zero. The counter row is locked after
-- the ledger key.
SELECT r.found::boolean AS quota_found,
       coalesce(r.kind, '')::text AS kind,
       r.window_start::timestamptz AS window_start,
       r.window_end::timestamptz AS window_end,
       r.grant_id::bigint AS grant_id,
       r.used::bigint AS used,
       r.revoked::bigint AS revoked,
       r.prior_grant_id::bigint AS prior_grant_id
FROM pgquota.revoke_keyed(@scope::text, @idempotency_key::text, @quota_name::text, @member::text, @amount::bigint) r;

-- name: LedgerClaimVoucher :one
-- VoucherClaimCounted (voucher_claim.sql) with a ledger row. The pool row is
-- locked after the ledger key (pool selects FROM led). A sold-out pool and a
-- member who already holds a unit are outcomes too, stored and replayed.
WITH camp AS (
    SELECT p.campaign, p.kind, p.total, pgquota.clock() AS at
    FROM pgquota.voucher_pool p
    WHERE p.campaign = @campaign::text
), led AS (
    INSERT INTO pgquota.ledger (scope, idempotency_key, operation, target, member, amount, created_at)
    SELECT @scope::text, @idempotency_key::text, 'claim', camp.campaign, @member::text, 1, camp.at
    FROM camp
    WHERE camp.kind = 'counted'
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING grant_id
), pool AS (
    SELECT p.campaign, p.claimed
    FROM pgquota.voucher_pool p
    CROSS JOIN led
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
    SELECT f.seq, f.claimed_at
    FROM pgquota.voucher_claim_fresh(@campaign::text, @member::text) f
    WHERE EXISTS (SELECT 1 FROM led)
      AND NOT EXISTS (SELECT 1 FROM ins)
      AND f.member IS NOT NULL
), res AS (
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, limit_value, seq, repeat, claimed_at, decided_at)
    SELECT led.grant_id,
           ins.seq IS NOT NULL OR prior.seq IS NOT NULL,
           coalesce((SELECT upd.claimed FROM upd), 0),
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

-- name: LedgerClaimCode :one
-- VoucherCodeClaim (voucher_code.sql) with a ledger row. pick locks one
-- unclaimed code with SKIP LOCKED (it never waits, so it takes no part in a
-- lock-order cycle); then the ledger key is inserted, and the claim selects
-- FROM both. The ledger row is written only when the outcome is final: a
-- code was picked, the member already holds one, or no unclaimed code is
-- left (both read with one fresh snapshot). When unclaimed codes exist but all are
-- locked by claims in progress, nothing is written and codes_left tells
-- the caller to try again, as for the keyless claim.
WITH camp AS (
    SELECT p.campaign, p.kind, p.total, pgquota.clock() AS at
    FROM pgquota.voucher_pool p
    WHERE p.campaign = @campaign::text
), pick AS (
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
), state AS (
    -- The member's code and whether any code is left, from one fresh
    -- snapshot (see VoucherCodeClaim in voucher_code.sql for why one).
    SELECT f.held_code AS code, f.codes_left
    FROM pgquota.voucher_code_state_fresh(@campaign::text, @member::text) AS f (held_code, held_since, codes_left)
    WHERE NOT EXISTS (SELECT 1 FROM pick)
), led AS (
    INSERT INTO pgquota.ledger (scope, idempotency_key, operation, target, member, amount, created_at)
    SELECT @scope::text, @idempotency_key::text, 'claim', camp.campaign, @member::text, 1, camp.at
    FROM camp
    WHERE camp.kind = 'codes'
      AND (EXISTS (SELECT 1 FROM pick)
           OR EXISTS (SELECT 1 FROM state WHERE state.code IS NOT NULL OR NOT state.codes_left))
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING grant_id
), ins AS (
    INSERT INTO pgquota.voucher_claim (campaign, member, code, claimed_at)
    SELECT pick.campaign, @member::text, pick.code, pgquota.clock()
    FROM pick
    CROSS JOIN led
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
    SELECT f.code, f.claimed_at
    FROM pgquota.voucher_claim_fresh(@campaign::text, @member::text) f
    WHERE EXISTS (SELECT 1 FROM led)
      AND NOT EXISTS (SELECT 1 FROM ins)
      AND f.member IS NOT NULL
), res AS (
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, limit_value, code, repeat, claimed_at, decided_at)
    SELECT led.grant_id,
           EXISTS (SELECT 1 FROM upd) OR prior.code IS NOT NULL,
           camp.total,
           coalesce(ins.code, prior.code, ''),
           ins.code IS NULL AND prior.code IS NOT NULL,
           coalesce(ins.claimed_at, prior.claimed_at),
           camp.at
    FROM led
    CROSS JOIN camp
    LEFT JOIN ins ON true
    LEFT JOIN prior ON true
    RETURNING grant_id, granted, code, repeat, claimed_at
)
SELECT (camp.campaign IS NOT NULL)::boolean AS campaign_found,
       coalesce(camp.kind, '')::text AS kind,
       coalesce(camp.total, 0)::bigint AS total,
       coalesce(res.grant_id, 0)::bigint AS grant_id,
       coalesce(res.granted, false)::boolean AS claimed,
       coalesce(res.code, '')::text AS code,
       coalesce(res.repeat, false)::boolean AS repeat,
       res.claimed_at::timestamptz AS claimed_at,
       (CASE WHEN res.grant_id IS NULL
             THEN pgquota.ledger_key_fresh(@scope::text, @idempotency_key::text)
             ELSE 0 END)::bigint AS prior_grant_id
FROM (SELECT 1) one
LEFT JOIN camp ON true
LEFT JOIN res ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: LedgerRevokeGrant :one
-- Compensates one keyed grant: pgquota.compensate_grant (migrations/00014)
-- gives its units back to the counter row of the grant's own window (not
-- the current one), at most once, never more than the grant took and never
-- below zero, and documents why concurrent compensations give back once.
-- A denied grant is marked with 0 units. written_used is the counter as
-- written (-1 when nothing was written): it equals compensated_used, which
-- the caller checks. No row comes back when grant_id is not a keyed grant.
-- revoked_now is false when an earlier revoke marked the grant; the caller
-- then reads the stored compensation.
SELECT c.grant_id::bigint AS grant_id,
       c.target::text AS target,
       c.member::text AS member,
       c.amount::bigint AS amount,
       c.granted::boolean AS granted,
       c.window_start::timestamptz AS window_start,
       c.window_end::timestamptz AS window_end,
       c.revoked_now::boolean AS revoked_now,
       c.compensated::bigint AS compensated,
       c.compensated_used::bigint AS compensated_used,
       c.compensated_at::timestamptz AS compensated_at,
       c.written_used::bigint AS written_used
FROM pgquota.compensate_grant(@grant_id::bigint) c;

-- name: LedgerGet :one
SELECT grant_id, scope, idempotency_key, operation, target, member, amount, request_limit, created_at,
       granted, used, limit_value, revoked, window_start, window_end, seq, code, repeat, claimed_at,
       decided_at, compensated, compensated_used, compensated_at
FROM pgquota.ledger_entry
WHERE grant_id = @grant_id::bigint;

-- name: LedgerGetByKey :one
SELECT grant_id, scope, idempotency_key, operation, target, member, amount, request_limit, created_at,
       granted, used, limit_value, revoked, window_start, window_end, seq, code, repeat, claimed_at,
       decided_at, compensated, compensated_used, compensated_at
FROM pgquota.ledger_entry
WHERE scope = @scope::text AND idempotency_key = @idempotency_key::text;

-- name: LedgerReap :execrows
-- Deletes up to @batch_size ledger rows (and their outcomes) created more
-- than @older_than_us microseconds before the database clock's now. The
-- caller repeats it until fewer rows come back, so no single statement
-- holds many row locks.
DELETE FROM pgquota.ledger
WHERE grant_id IN (
    SELECT l.grant_id
    FROM pgquota.ledger l
    WHERE l.created_at < pgquota.clock() - sqlc.arg('older_than_us')::bigint * interval '1 microsecond'
    ORDER BY l.created_at
    LIMIT @batch_size::int
);
