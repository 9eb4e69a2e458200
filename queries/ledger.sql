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
--      statements (usage.sql; for claims, the functions of migrations/00015), and are
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
FROM pgquota.grant_keyed_row(@scope::text, @idempotency_key::text, @quota_name::text, @member::text,
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

-- name: LedgerClaim :one
-- A voucher claim of any campaign kind with a ledger row: pgquota.claim_keyed
-- (migrations/00015_sql_claims.sql), built as the statements above are (the
-- ledger key first, then the pool or shard row; a code campaign's SKIP
-- LOCKED pick, which never waits, before the key). A sold-out pool and a
-- member who already holds a voucher are outcomes too, stored and
-- replayed; a busy code claim (every unclaimed code locked) stores nothing.
SELECT c.found::boolean AS campaign_found,
       c.kind::text AS kind,
       c.total::bigint AS total,
       c.claimed::boolean AS claimed,
       c.repeat::boolean AS repeat,
       c.seq::bigint AS seq,
       c.code::text AS code,
       c.claimed_at::timestamptz AS claimed_at,
       c.busy::boolean AS busy,
       c.grant_id::bigint AS grant_id,
       c.prior_grant_id::bigint AS prior_grant_id
FROM pgquota.claim_keyed(@scope::text, @idempotency_key::text, @campaign::text, @member::text) c;

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

-- name: LedgerReap :one
-- Deletes up to @batch_size ledger rows (and their outcomes) created more
-- than @older_than_us microseconds before the database clock's now. The
-- caller repeats it until fewer rows come back, so no single statement
-- holds many row locks.
-- The statement is pgquota.ledger_reap (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.ledger_reap(@older_than_us::bigint, @batch_size::int)::bigint AS rows;
