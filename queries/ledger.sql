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

-- name: LedgerGrant :one
-- UsageGrant (usage.sql) with a ledger row. The ledger row is written only
-- when the quota exists and a limit applies; otherwise nothing is written
-- and the caller reports ErrQuotaNotFound or ErrNoLimit (unless the key was
-- used before: then its stored outcome is replayed).
WITH def AS (
    SELECT q.name,
           coalesce(sqlc.narg('limit_value')::bigint, o.limit_value, q.default_limit) AS limit_value,
           pgquota.window_start(q.window_unit, q.time_zone, c.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, c.at) AS window_end,
           c.at
    FROM pgquota.quota q
    CROSS JOIN (SELECT pgquota.clock() AS at) c
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = @member::text
    WHERE q.name = @quota_name::text
), led AS (
    INSERT INTO pgquota.ledger (scope, idempotency_key, operation, target, member, amount, request_limit, created_at)
    SELECT @scope::text, @idempotency_key::text, 'grant', def.name, @member::text, @amount::bigint,
           sqlc.narg('limit_value')::bigint, def.at
    FROM def
    WHERE def.limit_value IS NOT NULL
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING grant_id
), upd AS (
    UPDATE pgquota.usage u
    SET used = u.used + @amount::bigint,
        updated_at = def.at
    FROM def, led
    WHERE u.quota_name = def.name
      AND u.member = @member::text
      AND u.window_start = def.window_start
      AND u.window_end = def.window_end
      AND u.used + @amount::bigint <= def.limit_value
    RETURNING u.used
), ins AS (
    INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
    SELECT def.name, @member::text, def.window_start, def.window_end, @amount::bigint, def.at
    FROM def, led
    WHERE @amount::bigint <= def.limit_value
      AND NOT EXISTS (
          SELECT 1 FROM pgquota.usage x
          WHERE x.quota_name = def.name
            AND x.member = @member::text
            AND x.window_start = def.window_start
            AND x.window_end = def.window_end
      )
    ON CONFLICT (quota_name, member, window_start, window_end) DO UPDATE
    SET used = u.used + excluded.used,
        updated_at = excluded.updated_at
    WHERE u.used + excluded.used <= (SELECT def.limit_value FROM def)
    RETURNING u.used
), granted AS (
    SELECT upd.used FROM upd
    UNION ALL
    SELECT ins.used FROM ins
), res AS (
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, limit_value, window_start, window_end, decided_at)
    SELECT led.grant_id,
           g.used IS NOT NULL,
           coalesce(g.used, pgquota.usage_used_fresh(def.name, @member::text, def.window_start, def.window_end)),
           def.limit_value, def.window_start, def.window_end, def.at
    FROM led
    CROSS JOIN def
    LEFT JOIN granted g ON true
    RETURNING grant_id, granted, used
)
SELECT (def.name IS NOT NULL)::boolean AS quota_found,
       (def.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(def.limit_value, 0)::bigint AS limit_value,
       def.window_start::timestamptz AS window_start,
       def.window_end::timestamptz AS window_end,
       coalesce(res.grant_id, 0)::bigint AS grant_id,
       coalesce(res.granted, false)::boolean AS granted,
       coalesce(res.used, 0)::bigint AS used,
       (CASE WHEN res.grant_id IS NULL
             THEN pgquota.ledger_key_fresh(@scope::text, @idempotency_key::text)
             ELSE 0 END)::bigint AS prior_grant_id
FROM (SELECT 1) one
LEFT JOIN def ON true
LEFT JOIN res ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: LedgerRevoke :one
-- UsageRevoke (usage.sql) with a ledger row: gives back up to @amount units
-- of the member's counter in the current window, never below zero. The
-- counter row is locked after the ledger key (cur selects FROM led).
WITH def AS (
    SELECT q.name,
           pgquota.window_start(q.window_unit, q.time_zone, c.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, c.at) AS window_end,
           c.at
    FROM pgquota.quota q
    CROSS JOIN (SELECT pgquota.clock() AS at) c
    WHERE q.name = @quota_name::text
), led AS (
    INSERT INTO pgquota.ledger (scope, idempotency_key, operation, target, member, amount, created_at)
    SELECT @scope::text, @idempotency_key::text, 'revoke', def.name, @member::text, @amount::bigint, def.at
    FROM def
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING grant_id
), cur AS (
    SELECT u.quota_name, u.member, u.window_start, u.window_end, u.used
    FROM pgquota.usage u
    JOIN def ON u.quota_name = def.name
            AND u.window_start = def.window_start
            AND u.window_end = def.window_end
    CROSS JOIN led
    WHERE u.member = @member::text
    FOR UPDATE OF u
), upd AS (
    UPDATE pgquota.usage u
    SET used = u.used - least(u.used, @amount::bigint),
        updated_at = def.at
    FROM def, cur
    WHERE u.quota_name = cur.quota_name
      AND u.member = cur.member
      AND u.window_start = cur.window_start
      AND u.window_end = cur.window_end
    RETURNING u.used
), res AS (
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, revoked, window_start, window_end, decided_at)
    SELECT led.grant_id, true,
           coalesce(upd.used, 0),
           coalesce(cur.used, 0) - coalesce(upd.used, 0),
           def.window_start, def.window_end, def.at
    FROM led
    CROSS JOIN def
    LEFT JOIN cur ON true
    LEFT JOIN upd ON true
    RETURNING grant_id, used, revoked
)
SELECT (def.name IS NOT NULL)::boolean AS quota_found,
       def.window_start::timestamptz AS window_start,
       def.window_end::timestamptz AS window_end,
       coalesce(res.grant_id, 0)::bigint AS grant_id,
       coalesce(res.used, 0)::bigint AS used,
       coalesce(res.revoked, 0)::bigint AS revoked,
       (CASE WHEN res.grant_id IS NULL
             THEN pgquota.ledger_key_fresh(@scope::text, @idempotency_key::text)
             ELSE 0 END)::bigint AS prior_grant_id
FROM (SELECT 1) one
LEFT JOIN def ON true
LEFT JOIN res ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

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
-- Compensates one keyed grant: gives its units back to the counter row of
-- the grant's own window (not the current one), at most once, never more
-- than the grant took and never below zero.
--
-- cur locks that counter row first (a locking read returns its newest
-- version); mark then records the compensation in the grant's outcome row,
-- guarded by compensated_at IS NULL in the WHERE clause of that row. Of
-- concurrent revokes of one grant, the first to lock the counter row marks
-- the outcome; the others wait for it, and under READ COMMITTED their
-- UPDATE re-checks the guard on the newest version (section 13.2.1), finds
-- the grant compensated and does nothing. The counter update selects FROM
-- mark, so units are given back only by the revoke that marked the grant.
-- Locks: counter row, then outcome row; a keyed grant takes the ledger key,
-- then the counter row, and never waits for an outcome row, so there is no
-- cycle.
--
-- A denied grant is marked with 0 units. written_used is the counter upd
-- wrote (-1 when it wrote nothing): it equals compensated_used, which the
-- caller checks. No row comes back when grant_id is not a keyed grant. revoked_now is false when an earlier revoke marked the
-- grant; the caller then reads the stored compensation.
WITH g AS (
    SELECT l.grant_id, l.target, l.member, l.amount, o.granted, o.window_start, o.window_end
    FROM pgquota.ledger l
    JOIN pgquota.ledger_outcome o ON o.grant_id = l.grant_id
    WHERE l.grant_id = @grant_id::bigint
      AND l.operation = 'grant'
), cur AS (
    SELECT u.quota_name, u.member, u.window_start, u.window_end, u.used
    FROM pgquota.usage u
    JOIN g ON u.quota_name = g.target
          AND u.member = g.member
          AND u.window_start = g.window_start
          AND u.window_end = g.window_end
    WHERE g.granted
    FOR UPDATE OF u
), mark AS (
    UPDATE pgquota.ledger_outcome o
    SET compensated = least(coalesce(cur.used, 0), g.amount),
        compensated_used = coalesce(cur.used, 0) - least(coalesce(cur.used, 0), g.amount),
        compensated_at = pgquota.clock()
    FROM g
    LEFT JOIN cur ON true
    WHERE o.grant_id = g.grant_id
      AND o.compensated_at IS NULL
    RETURNING o.compensated, o.compensated_used, o.compensated_at
), upd AS (
    -- least(): PostgreSQL computes the new row, and checks it against
    -- usage_used_nonnegative, from the version in the statement's snapshot
    -- BEFORE it finds that version superseded and re-evaluates SET on the
    -- newest one (the one cur locked). The snapshot's version can hold
    -- fewer units than cur read (a grant that committed while cur waited
    -- for its lock): u.used - mark.compensated would fail the check there
    -- although the row actually written holds them. On the locked version
    -- least() is mark.compensated itself (cur.used >= compensated).
    UPDATE pgquota.usage u
    SET used = u.used - least(u.used, mark.compensated),
        updated_at = mark.compensated_at
    FROM cur, mark
    WHERE u.quota_name = cur.quota_name
      AND u.member = cur.member
      AND u.window_start = cur.window_start
      AND u.window_end = cur.window_end
      AND mark.compensated > 0
    RETURNING u.used
)
SELECT g.grant_id, g.target, g.member, g.amount, g.granted,
       g.window_start::timestamptz AS window_start,
       g.window_end::timestamptz AS window_end,
       (mark.compensated IS NOT NULL)::boolean AS revoked_now,
       coalesce(mark.compensated, 0)::bigint AS compensated,
       coalesce(mark.compensated_used, 0)::bigint AS compensated_used,
       mark.compensated_at::timestamptz AS compensated_at,
       coalesce((SELECT upd.used FROM upd), -1)::bigint AS written_used
FROM g
LEFT JOIN mark ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

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
