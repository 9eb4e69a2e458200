-- Least privilege, enforced: the application's role can use the API and
-- nothing else.
--
-- Three NOLOGIN group roles (cluster-wide, like pgquota_app of 00010):
--   pgquota_app       the API: grants, revokes, claims, usage, leases,
--                     fenced writes, present_token, elections, semaphores,
--                     outbox enqueue, and reads (SELECT on the tables).
--   pgquota_relay     the outbox relay: claim, mark delivered/failed, reap.
--   pgquota_operator  member of both; defines quotas and campaigns, sets
--                     limits and overrides, imports codes, bumps lease
--                     epochs, registers fence guards, reaps leases and the
--                     ledger.
-- None of them holds INSERT, UPDATE, DELETE or TRUNCATE on a table of
-- schema pgquota, or any privilege on its sequences. Every write goes
-- through a SECURITY DEFINER function owned by the role that migrates (the
-- schema's owner), with search_path pinned to pg_catalog, pgquota, pg_temp
-- and no dynamic SQL built from its arguments. EXECUTE is revoked from
-- PUBLIC on every function of the schema and granted per role from the
-- allowlist pgquota.function_grant; internal helpers (fence_admit,
-- grant_counter, next_lease_token, greedy_take, ...) are executable by
-- nobody but the owner.
--
-- The statements that sqlc ran as the caller (queries/*.sql) are the bodies
-- of the functions below, unchanged (the query file calls the function),
-- but for two that took a value the caller computed: the fenced grant's
-- write (usage_fenced_write) now computes the counter from the request, and
-- a keyed batch's outcomes are stored by the statement that decided them
-- (usage_grant_batch_keyed, in place of an outcomes statement fed by the
-- caller). No function takes a counter value or an outcome from its caller.
--
-- A later migration that creates or replaces a function of the schema
-- (CREATE OR REPLACE resets SECURITY DEFINER and the search_path) adds its
-- row to pgquota.function_grant when the function is API and ends with
-- SELECT pgquota.grant_roles(). PostgreSQL grants EXECUTE on a new function
-- to PUBLIC (per-schema default privileges cannot revoke that), so
-- grant_roles() revokes it again; migrations/function_privileges_test.go
-- fails when a function is executable by PUBLIC or a pgquota role without
-- its allowlist row, or is on the list without SECURITY DEFINER and the
-- pinned search_path.
--
-- A migrator without CREATEROLE that finds pgquota_relay or
-- pgquota_operator missing gets a WARNING; once an administrator has run
-- CREATE ROLE pgquota_relay NOLOGIN; CREATE ROLE pgquota_operator NOLOGIN;
-- GRANT pgquota_app, pgquota_relay TO pgquota_operator, running
-- `pgquota migrate grant-operator` (pgquota.grant_roles()) grants them.

-- +goose Up

-- Row types of the functions whose rows have nullable columns (sqlc reads
-- a table's columns with their nullability; a composite type it does not).
-- They hold no rows (CHECK (false)) and depend on no other table, so that
-- a later ALTER of pgquota.outbox or pgquota.quota is not refused.
CREATE TABLE pgquota.outbox_claimed (
    id                bigint      NOT NULL,
    topic             text        NOT NULL,
    payload           bytea       NOT NULL,
    grant_id          bigint,
    idempotency_scope text,
    idempotency_key   text,
    fencing_token     bigint,
    attempts          integer     NOT NULL,
    created_at        timestamptz NOT NULL,
    db_now            timestamptz,
    CONSTRAINT outbox_claimed_row_type_only CHECK (false)
);

CREATE TABLE pgquota.quota_shape_defined (
    name          text        NOT NULL,
    window_unit   text        NOT NULL,
    time_zone     text        NOT NULL,
    default_limit bigint,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    period_us     bigint      NOT NULL,
    burst         bigint,
    origin        timestamptz,
    CONSTRAINT quota_shape_defined_row_type_only CHECK (false)
);

-- pgquota.lease_args_check refuses what the Go library refuses before it
-- sends a lease call (quota/lease.go: MinLeaseTTL, MaxLeaseTTL, names and
-- holders of 1 to 255 bytes without control characters), for callers of
-- the SQL functions: SQLSTATE 22023 naming the parameter, never echoing
-- the value. Internal (no role executes it).
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_args_check(p_fn text, p_name text, p_ttl interval, p_holder text, p_attempt text, p_check_holder boolean)
RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    IF p_name IS NULL OR octet_length(p_name) NOT BETWEEN 1 AND 255 OR p_name ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota.%s: p_name must be 1 to 255 bytes without control characters', p_fn);
    END IF;
    IF p_ttl IS NULL OR p_ttl < interval '1 millisecond' OR p_ttl > interval '24 hours' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota.%s: p_ttl must be 1 ms to 24 h', p_fn);
    END IF;
    IF p_check_holder THEN
        IF p_holder IS NULL OR octet_length(p_holder) NOT BETWEEN 1 AND 255 OR p_holder ~ '[[:cntrl:]]' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgquota.%s: p_holder must be 1 to 255 bytes without control characters', p_fn);
        END IF;
        IF p_attempt IS NULL OR octet_length(p_attempt) NOT BETWEEN 1 AND 255 OR p_attempt ~ '[[:cntrl:]]' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgquota.%s: p_attempt must be 1 to 255 bytes without control characters', p_fn);
        END IF;
    END IF;
END
$fn$;
-- +goose StatementEnd

-- LeaseAcquire (queries/lease.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_acquire(p_ttl interval, p_name text, p_holder text, p_attempt text)
RETURNS TABLE (taken boolean, name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pgquota.lease_args_check('lease_acquire', $2::text, $1::interval, $3::text, $4::text, true);
    -- A semaphore slot's lease ('slot:' names) is taken by
    -- pgquota.slot_acquire only, which counts the semaphore's holders. The
    -- slot trigger's session setting (00012) can be set by any client, so
    -- the refusal is here, before anything is written.
    IF starts_with($2::text, 'slot:') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ012',
            MESSAGE = format('pgquota: lease %s is a semaphore slot: acquire it with AcquireSlot (pgquota slot acquire), not as a lease', left($2::text, 255)),
            DETAIL  = json_build_object('lease', left($2::text, 255))::text;
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT pgquota.clock() AS at, $1::interval AS ttl, pgquota.durable_commit() AS durable
    ), inserted_at AS (
        SELECT pgquota.clock() AS at
    ), taken_at AS (
        SELECT pgquota.clock() AS at
    ), acq AS (
        INSERT INTO pgquota.lease AS l (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
        SELECT $2::text, $3::text, $4::text,
               (SELECT pgquota.next_lease_token()
                FROM pg_advisory_xact_lock(hashtextextended('pgquota.lease:' || $2::text, 0))),
               (SELECT at FROM inserted_at), (SELECT at FROM inserted_at), (SELECT at FROM inserted_at) + c.ttl
        FROM c
        WHERE NOT EXISTS (
            SELECT 1 FROM pgquota.lease x
            WHERE x.name = $2::text AND x.expires_at > c.at AND x.attempt <> $4::text
        )
        ON CONFLICT (name) DO UPDATE
        SET holder      = excluded.holder,
            attempt     = excluded.attempt,
            token       = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.token ELSE pgquota.next_lease_token() END,
            acquired_at = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.acquired_at ELSE (SELECT at FROM taken_at) END,
            renewed_at  = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.renewed_at ELSE (SELECT at FROM taken_at) END,
            expires_at  = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.expires_at ELSE (SELECT at FROM taken_at) + $1::interval END
        WHERE l.expires_at <= (SELECT at FROM taken_at) OR l.attempt = excluded.attempt
        RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, pgquota.clock() AS db_now
    ), raised AS (
        INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
        SELECT acq.name, acq.token, c.at
        FROM acq, c
        -- Not the resource of a guarded table bound to another source of tokens
        -- (another lease, a semaphore, external tokens: 00018_guard_binding.sql):
        -- this lease's token is refused there, and raising the mark would lock
        -- the table's real holders out.
        WHERE NOT EXISTS (
            SELECT 1 FROM pgquota.fence_guard_resource g
            WHERE g.resource = acq.name AND (g.external OR g.semaphore IS NOT NULL OR g.lease <> acq.name)
        )
        ON CONFLICT (resource) DO UPDATE
        SET max_token  = excluded.max_token,
            updated_at = excluded.updated_at
        WHERE f.max_token < excluded.max_token
    )
    SELECT true AS taken, acq.name, acq.holder, acq.attempt, acq.token, acq.acquired_at, acq.renewed_at, acq.expires_at, acq.db_now
    FROM acq
    UNION ALL
    SELECT false AS taken, f.name, f.holder, f.attempt, f.token, f.acquired_at, f.renewed_at, f.expires_at, pgquota.clock() AS db_now
    FROM pgquota.lease_fresh($2::text) f
    WHERE NOT EXISTS (SELECT 1 FROM acq);
END
$fn$;
-- +goose StatementEnd

-- LeaseRenew (queries/lease.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_renew(p_name text, p_token bigint, p_ttl interval)
RETURNS TABLE (name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz, prev_expires_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pgquota.lease_args_check('lease_renew', $1::text, $3::interval, NULL, NULL, false);
    RETURN QUERY
    WITH locked AS (
        SELECT x.name, x.expires_at FROM pgquota.lease x
        WHERE x.name = $1::text AND x.token = $2::bigint
        FOR NO KEY UPDATE
    ), c AS (
        SELECT pgquota.clock() AS at, $3::interval AS ttl, locked.expires_at AS prev_expires_at FROM locked
    )
    UPDATE pgquota.lease l
    SET renewed_at = c.at,
        expires_at = c.at + c.ttl
    FROM c
    WHERE l.name = $1::text
      AND l.token = $2::bigint
      AND l.expires_at > c.at
      AND pgquota.durable_commit()
    RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now,
              c.prev_expires_at;
END
$fn$;
-- +goose StatementEnd

-- LeaseRelease (queries/lease.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_release(p_name text, p_token bigint)
RETURNS TABLE (name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz, notified boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE pgquota.lease l
    SET expires_at = least(l.expires_at, c.at)
    FROM (SELECT pgquota.clock() AS at) c
    WHERE l.name = $1::text
      AND l.token = $2::bigint
      AND pgquota.durable_commit()
    RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now,
              pgquota.lease_notify_waiters(l.name) AS notified;
END
$fn$;
-- +goose StatementEnd

-- LeasePayloadSet (queries/lease_admin.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_payload_set(p_payload text, p_name text, p_token bigint, p_require_held boolean)
RETURNS TABLE (name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz, payload text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE pgquota.lease l
    SET payload = $1::text,
        payload_token = l.token
    FROM (SELECT pgquota.clock() AS at) c
    WHERE l.name = $2::text
      AND l.token = $3::bigint
      AND (NOT $4::boolean OR l.expires_at > pgquota.clock())
      AND pgquota.durable_commit()
    RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now,
              coalesce(l.payload, '')::text AS payload;
END
$fn$;
-- +goose StatementEnd

-- LeaseWaitUnregister (queries/lease_wait.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_wait_unregister(p_name text, p_waiter text)
RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    DELETE FROM pgquota.lease_waiter WHERE name = $1::text AND waiter = $2::text;
END
$fn$;
-- +goose StatementEnd

-- FencedRowWrite (queries/fenced_row.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fenced_row_write(p_resource text, p_key text, p_value text, p_token bigint, p_lease text)
RETURNS SETOF pgquota.fenced_row
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    RETURN QUERY
    INSERT INTO pgquota.fenced_row AS r (resource, key, value, fence_token, updated_at)
    SELECT $1::text, $2::text, $3::text, $4::bigint, pgquota.clock()
    WHERE pgquota.fence_admit($1::text, $4::bigint, $5::text)
    ON CONFLICT (resource, key) DO UPDATE
    SET value       = excluded.value,
        fence_token = excluded.fence_token,
        updated_at  = excluded.updated_at
    WHERE r.fence_token <= excluded.fence_token
    RETURNING r.resource, r.key, r.value, r.fence_token, r.updated_at;
END
$fn$;
-- +goose StatementEnd

-- UsageFencedWrite (queries/usage_fenced.sql) as pgquota_app: the write of
-- the fenced grant (quota/grant_fenced.go), which computes the counter
-- itself. The caller says only what it asks for: p_amount units (at least
-- 1) of quota p_quota_name for p_member, against its own limit p_limit
-- (NULL for none: the member's override, else the quota's default, as
-- UsageFencedRead), under lease p_lease with token p_token, decided on the
-- counter at p_read_used. The window is the one the database clock is in,
-- from the quota's definition. The counter moves by p_amount, only while it
-- still holds p_read_used and p_amount fits the limit, and only when
-- pgquota.fence_admit admits the token (or raises PQ001/PQ002); otherwise
-- no row comes back and nothing was written. Whatever a caller passes, the
-- limit holds and the counter only moves by a granted amount. Bad
-- arguments: 22023.
-- +goose StatementBegin
CREATE FUNCTION pgquota.usage_fenced_write(p_quota_name text, p_member text, p_amount bigint, p_limit bigint, p_lease text, p_token bigint, p_read_used bigint)
RETURNS TABLE (used bigint, window_start timestamptz, window_end timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_at    timestamptz := pgquota.clock();
    v_limit bigint;
    v_ws    timestamptz;
    v_we    timestamptz;
BEGIN
    IF p_amount IS NULL OR p_amount < 1 THEN
        RAISE EXCEPTION 'pgquota: usage_fenced_write: amount must be at least 1, got %', coalesce(p_amount::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_limit < 0 THEN
        RAISE EXCEPTION 'pgquota: usage_fenced_write: limit must be at least 0, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_read_used IS NULL OR p_read_used < 0 THEN
        RAISE EXCEPTION 'pgquota: usage_fenced_write: read_used must be at least 0, got %', coalesce(p_read_used::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(p_limit, o.limit_value, q.default_limit),
           pgquota.window_start(q.window_unit, q.time_zone, v_at),
           pgquota.window_end(q.window_unit, q.time_zone, v_at)
    INTO v_limit, v_ws, v_we
    FROM pgquota.quota q
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = p_member
    WHERE q.name = p_quota_name;
    -- No quota, no limit, or an amount that does not fit the counter the
    -- decision was made on: nothing to write.
    IF v_limit IS NULL OR p_amount > v_limit - p_read_used THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
    SELECT p_quota_name, p_member, v_ws, v_we, p_amount, v_at
    WHERE pgquota.fence_admit(p_lease, p_token, p_lease)
    ON CONFLICT (quota_name, member, window_start, window_end) DO UPDATE
    SET used = u.used + excluded.used,
        updated_at = excluded.updated_at
    WHERE u.used = p_read_used
    RETURNING u.used, u.window_start, u.window_end;
END
$fn$;
-- +goose StatementEnd

-- LedgerBatchInsert (queries/ledger_batch.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.ledger_batch_insert(p_scopes text[], p_keys text[], p_quota_names text[], p_members text[], p_amounts bigint[], p_limit_values bigint[])
RETURNS TABLE (scope text, idempotency_key text, grant_id bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    
    WITH req AS (
        SELECT unnest($1::text[]) AS scope,
               unnest($2::text[]) AS idempotency_key,
               unnest($3::text[]) AS quota_name,
               unnest($4::text[]) AS member,
               unnest($5::bigint[]) AS amount,
               nullif(unnest($6::bigint[]), -1) AS limit_value
    )
    INSERT INTO pgquota.ledger (scope, idempotency_key, operation, target, member, amount, request_limit, created_at)
    SELECT r.scope, r.idempotency_key, 'grant', q.name, r.member, r.amount, r.limit_value, pgquota.clock()
    FROM req r
    JOIN pgquota.quota q ON q.name = r.quota_name
    LEFT JOIN pgquota.quota_override o ON o.quota_name = r.quota_name AND o.member = r.member
    WHERE coalesce(r.limit_value, o.limit_value, q.default_limit) IS NOT NULL
      AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
    ORDER BY r.scope, r.idempotency_key
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING scope, idempotency_key, grant_id;
END
$fn$;
-- +goose StatementEnd

-- UsageGrantBatchKeyed (queries/ledger_batch.sql) as pgquota_app: a keyed
-- batch's grants and the outcomes of its keys, in one statement. The
-- arguments are pgquota.usage_grant_batch's (00016), which decides the
-- counters, plus p_grant_ids: element j is the grant id LedgerBatchInsert
-- returned for request j, or 0 for a request without a key recorded now.
-- Each request's outcome is replayed from the counter before, in array
-- order, as pgquota.greedy_take decided it (quota/batch.go replays the
-- same), and a keyed request's outcome is stored here, never taken from
-- the caller: the ledger entry must be a grant of exactly this request
-- (quota, member, amount, limit) with no outcome yet, or the statement
-- fails with 22023 and nothing is written. A keyed request that could not
-- be decided (its quota or limit gone) gets no outcome; the caller rolls
-- back. Returns usage_grant_batch's rows.
-- +goose StatementBegin
CREATE FUNCTION pgquota.usage_grant_batch_keyed(
    p_quota_names text[], p_members text[], p_firsts integer[], p_counts integer[],
    p_amounts bigint[], p_limits bigint[], p_grant_ids bigint[]
) RETURNS TABLE (
    counter_index      integer,
    implicit_limit     bigint,
    window_start       timestamptz,
    window_end         timestamptz,
    written            boolean,
    used_before        bigint,
    used_after         bigint,
    decided_at         timestamptz
)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    r         record;
    j         integer;
    v_used    bigint;
    v_limit   bigint;
    v_granted boolean;
    v_n       integer;
BEGIN
    IF coalesce(cardinality(p_grant_ids), 0) <> coalesce(cardinality(p_amounts), 0)
       OR coalesce(cardinality(p_limits), 0) <> coalesce(cardinality(p_amounts), 0) THEN
        RAISE EXCEPTION 'pgquota: usage_grant_batch_keyed: grant_ids (%), limits (%) and amounts (%) must have one element per request',
            coalesce(cardinality(p_grant_ids), 0), coalesce(cardinality(p_limits), 0), coalesce(cardinality(p_amounts), 0)
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_grant_ids) g(id) WHERE g.id IS NULL OR g.id < 0)
       OR (SELECT count(*) FROM unnest(p_grant_ids) g(id) WHERE g.id > 0)
          <> (SELECT count(DISTINCT g.id) FROM unnest(p_grant_ids) g(id) WHERE g.id > 0) THEN
        RAISE EXCEPTION 'pgquota: usage_grant_batch_keyed: grant_ids must be distinct grant ids, or 0 for a request without a key'
            USING ERRCODE = '22023';
    END IF;
    FOR r IN
        SELECT b.* FROM pgquota.usage_grant_batch(p_quota_names, p_members, p_firsts, p_counts, p_amounts, p_limits) b
    LOOP
        v_used := r.used_before;
        FOR j IN p_firsts[r.counter_index] .. p_firsts[r.counter_index] + p_counts[r.counter_index] - 1 LOOP
            v_limit := coalesce(nullif(p_limits[j], -1), r.implicit_limit);
            v_granted := false;
            IF v_limit IS NOT NULL AND r.written AND p_amounts[j] <= v_limit - v_used THEN
                v_granted := true;
                v_used := v_used + p_amounts[j];
            END IF;
            CONTINUE WHEN p_grant_ids[j] = 0 OR v_limit IS NULL;
            INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, limit_value, window_start, window_end, decided_at)
            SELECT l.grant_id, v_granted, v_used, v_limit, r.window_start, r.window_end, r.decided_at
            FROM pgquota.ledger l
            WHERE l.grant_id = p_grant_ids[j]
              AND l.operation = 'grant'
              AND l.target = p_quota_names[r.counter_index]
              AND l.member = p_members[r.counter_index]
              AND l.amount = p_amounts[j]
              AND l.request_limit IS NOT DISTINCT FROM nullif(p_limits[j], -1)
              AND NOT EXISTS (SELECT 1 FROM pgquota.ledger_outcome o WHERE o.grant_id = l.grant_id);
            GET DIAGNOSTICS v_n = ROW_COUNT;
            IF v_n <> 1 THEN
                RAISE EXCEPTION 'pgquota: usage_grant_batch_keyed: grant id % is not an undecided ledger entry of request % (quota %, member %, amount %)',
                    p_grant_ids[j], j, p_quota_names[r.counter_index], p_members[r.counter_index], p_amounts[j]
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
        counter_index := r.counter_index;
        implicit_limit := r.implicit_limit;
        window_start := r.window_start;
        window_end := r.window_end;
        written := r.written;
        used_before := r.used_before;
        used_after := r.used_after;
        decided_at := r.decided_at;
        RETURN NEXT;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- OutboxEnqueue (queries/outbox.sql) as pgquota_app.
-- +goose StatementBegin
CREATE FUNCTION pgquota.outbox_enqueue(p_topic text, p_payload bytea, p_grant_id bigint, p_idempotency_scope text, p_idempotency_key text, p_fencing_token bigint)
RETURNS TABLE (id bigint, created_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO pgquota.outbox (topic, payload, grant_id, idempotency_scope, idempotency_key, fencing_token,
                                next_attempt_at, created_at)
    SELECT $1::text, $2::bytea, $3::bigint, $4::text,
           $5::text, $6::bigint, c.at, c.at
    FROM (SELECT pgquota.clock() AS at) c
    WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
    RETURNING id, created_at;
END
$fn$;
-- +goose StatementEnd

-- OutboxClaim (queries/outbox.sql) as pgquota_relay.
-- +goose StatementBegin
CREATE FUNCTION pgquota.outbox_claim(p_topics text[], p_batch_size int)
RETURNS SETOF pgquota.outbox_claimed
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    RETURN QUERY
    SELECT o.id, o.topic, o.payload, o.grant_id, o.idempotency_scope, o.idempotency_key, o.fencing_token,
           o.attempts::integer AS attempts, o.created_at, pgquota.clock()::timestamptz AS db_now
    FROM pgquota.outbox o
    WHERE o.state = 'pending'
      AND o.next_attempt_at <= (SELECT pgquota.clock())
      AND (cardinality($1::text[]) = 0 OR o.topic = ANY ($1::text[]))
    ORDER BY o.id
    LIMIT $2::int
    FOR UPDATE OF o SKIP LOCKED;
END
$fn$;
-- +goose StatementEnd

-- OutboxMarkDelivered (queries/outbox.sql) as pgquota_relay.
-- +goose StatementBegin
CREATE FUNCTION pgquota.outbox_mark_delivered(p_ids bigint[])
RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_rows bigint;
BEGIN
    UPDATE pgquota.outbox
    SET state = 'delivered',
        attempts = attempts + 1,
        last_error = NULL,
        finished_at = pgquota.clock()
    WHERE id = ANY ($1::bigint[])
      AND state = 'pending';
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$fn$;
-- +goose StatementEnd

-- OutboxMarkFailed (queries/outbox.sql) as pgquota_relay.
-- +goose StatementBegin
CREATE FUNCTION pgquota.outbox_mark_failed(p_max_attempts int, p_ids bigint[], p_errors text[], p_delays_us bigint[])
RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_rows bigint;
BEGIN
    UPDATE pgquota.outbox o
    SET attempts = o.attempts + 1,
        last_error = f.error,
        state = CASE WHEN o.attempts + 1 >= $1::int THEN 'dead' ELSE 'pending' END,
        finished_at = CASE WHEN o.attempts + 1 >= $1::int THEN c.at END,
        next_attempt_at = c.at + f.delay_us * interval '1 microsecond'
    FROM (
             SELECT unnest($2::bigint[]) AS id,
                    unnest($3::text[]) AS error,
                    unnest($4::bigint[]) AS delay_us
         ) f,
         (SELECT pgquota.clock() AS at) c
    WHERE o.id = f.id
      AND o.state = 'pending';
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$fn$;
-- +goose StatementEnd

-- OutboxReap (queries/outbox.sql) as pgquota_relay.
-- +goose StatementBegin
CREATE FUNCTION pgquota.outbox_reap(p_older_than_us bigint, p_batch_size int)
RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_rows bigint;
BEGIN
    DELETE FROM pgquota.outbox
    WHERE id IN (
        SELECT o.id
        FROM pgquota.outbox o
        WHERE o.state <> 'pending'
          AND o.finished_at < pgquota.clock() - $1::bigint * interval '1 microsecond'
        ORDER BY o.finished_at
        LIMIT $2::int
    );
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$fn$;
-- +goose StatementEnd

-- LedgerReap (queries/ledger.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.ledger_reap(p_older_than_us bigint, p_batch_size int)
RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_rows bigint;
BEGIN
    DELETE FROM pgquota.ledger
    WHERE grant_id IN (
        SELECT l.grant_id
        FROM pgquota.ledger l
        WHERE l.created_at < pgquota.clock() - $1::bigint * interval '1 microsecond'
        ORDER BY l.created_at
        LIMIT $2::int
    );
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$fn$;
-- +goose StatementEnd

-- LeaseReap (queries/lease_admin.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_reap(p_older_than_us bigint, p_batch_size int, p_fences boolean)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, fence_deleted boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        SELECT pgquota.clock() - $1::bigint * interval '1 microsecond' AS cutoff
    ), cand AS MATERIALIZED (
        SELECT l.name, l.token
        FROM pgquota.lease l, c
        WHERE l.expires_at < c.cutoff
        LIMIT $2::int
        FOR UPDATE OF l SKIP LOCKED
    ), locked AS MATERIALIZED (
        SELECT cand.name, cand.token
        FROM cand
        WHERE pg_try_advisory_xact_lock(hashtextextended('pgquota.lease:' || cand.name, 0))
    ), fences AS MATERIALIZED (
        SELECT f.resource
        FROM pgquota.fence f, locked k, c
        WHERE $3::boolean
          AND f.resource = k.name
          AND f.max_token <= k.token
          AND f.updated_at < c.cutoff
          AND NOT pgquota.fence_guarded(f.resource)
        FOR UPDATE OF f SKIP LOCKED
    ), fence_gone AS (
        DELETE FROM pgquota.fence f
        USING fences x
        WHERE f.resource = x.resource
        RETURNING f.resource
    ), lease_gone AS (
        DELETE FROM pgquota.lease l
        USING locked k
        WHERE l.name = k.name
        RETURNING l.name, l.token, l.expires_at
    )
    SELECT g.name, g.token, g.expires_at,
           EXISTS (SELECT 1 FROM fence_gone x WHERE x.resource = g.name) AS fence_deleted
    FROM lease_gone g
    ORDER BY g.name;
END
$fn$;
-- +goose StatementEnd

-- QuotaDefine (queries/quota.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.quota_define(p_name text, p_window_unit text, p_default_limit bigint, p_time_zone text, p_replace_kind boolean)
RETURNS SETOF pgquota.quota
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    -- No row, and nothing written, when the zone is unknown or when the
    -- quota exists with another kind (window_unit) and p_replace_kind is
    -- false. With p_replace_kind a change of kind deletes the quota's
    -- counters (usage) in the same statement, so none comes back when the
    -- quota is switched back; member limits stay. prev reads the row as the
    -- statement's snapshot saw it.
    RETURN QUERY
    WITH prev AS (
        SELECT p.window_unit FROM pgquota.quota p WHERE p.name = $1::text
    ), replaced AS (
        SELECT $5::boolean AND EXISTS (SELECT 1 FROM prev WHERE prev.window_unit <> $2::text) AS yes
    ), gone_usage AS (
        DELETE FROM pgquota.usage u WHERE u.quota_name = $1::text AND (SELECT r.yes FROM replaced r) RETURNING 1
    )
    INSERT INTO pgquota.quota (name, window_unit, time_zone, default_limit)
    SELECT $1::text, $2::text, tz.name, $3::bigint
    FROM (
        SELECT z.name FROM pg_catalog.pg_timezone_names z
        WHERE lower(z.name) = lower($4::text)
        ORDER BY z.name = $4::text DESC, z.name
        LIMIT 1
    ) tz
    WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
    ON CONFLICT (name) DO UPDATE
    SET window_unit   = excluded.window_unit,
        time_zone     = excluded.time_zone,
        default_limit = excluded.default_limit,
        updated_at    = pgquota.clock()
    WHERE pgquota.quota.window_unit = excluded.window_unit OR $5::boolean
    RETURNING name, window_unit, time_zone, default_limit, created_at, updated_at;
END
$fn$;
-- +goose StatementEnd

-- QuotaShapeDefine (queries/rate.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.quota_shape_define(p_name text, p_window_unit text, p_default_limit bigint, p_period_us bigint, p_burst bigint, p_origin timestamptz, p_replace_kind boolean)
RETURNS SETOF pgquota.quota_shape_defined
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    -- As quota_define: no row when the quota exists with another kind and
    -- p_replace_kind is false; with it a change of kind deletes its counters.
    RETURN QUERY
    WITH prev AS (
        SELECT p.window_unit FROM pgquota.quota p WHERE p.name = $1::text
    ), replaced AS (
        SELECT $7::boolean AND EXISTS (SELECT 1 FROM prev WHERE prev.window_unit <> $2::text) AS yes
    ), gone_usage AS (
        DELETE FROM pgquota.usage u WHERE u.quota_name = $1::text AND (SELECT r.yes FROM replaced r) RETURNING 1
    ), gone_rate AS (
        DELETE FROM pgquota.rate_state rs WHERE rs.quota_name = $1::text AND (SELECT r.yes FROM replaced r) RETURNING 1
    ), gone_rolling AS (
        DELETE FROM pgquota.rolling_usage ru WHERE ru.quota_name = $1::text AND (SELECT r.yes FROM replaced r) RETURNING 1
    ), q AS (
        INSERT INTO pgquota.quota (name, window_unit, time_zone, default_limit)
        SELECT $1::text, $2::text, 'UTC', $3::bigint
        WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
        ON CONFLICT (name) DO UPDATE
        SET window_unit   = excluded.window_unit,
            time_zone     = excluded.time_zone,
            default_limit = excluded.default_limit,
            updated_at    = pgquota.clock()
        WHERE pgquota.quota.window_unit = excluded.window_unit OR $7::boolean
        RETURNING name, window_unit, time_zone, default_limit, created_at, updated_at
    ), s AS (
        INSERT INTO pgquota.quota_shape (quota_name, period_us, burst, origin)
        SELECT q.name, $4::bigint, $5::bigint, $6::timestamptz FROM q
        ON CONFLICT (quota_name) DO UPDATE
        SET period_us  = excluded.period_us,
            burst      = excluded.burst,
            origin     = excluded.origin,
            updated_at = pgquota.clock()
        RETURNING quota_name, period_us, burst, origin
    )
    SELECT q.name, q.window_unit, q.time_zone, q.default_limit, q.created_at, q.updated_at,
           s.period_us, s.burst, s.origin
    FROM q JOIN s ON s.quota_name = q.name;
END
$fn$;
-- +goose StatementEnd

-- QuotaOverrideSet (queries/quota_override.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.quota_override_set(p_member text, p_limit_value bigint, p_quota_name text)
RETURNS SETOF pgquota.quota_override
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    RETURN QUERY
    INSERT INTO pgquota.quota_override (quota_name, member, limit_value)
    SELECT q.name, $1::text, $2::bigint
    FROM pgquota.quota q
    WHERE q.name = $3::text
      AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
    ON CONFLICT (quota_name, member) DO UPDATE
    SET limit_value = excluded.limit_value,
        updated_at  = pgquota.clock()
    RETURNING quota_name, member, limit_value, updated_at;
END
$fn$;
-- +goose StatementEnd

-- QuotaOverrideDelete (queries/quota_override.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.quota_override_delete(p_quota_name text, p_member text)
RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_rows bigint;
BEGIN
    DELETE FROM pgquota.quota_override
    WHERE quota_name = $1::text AND member = $2::text
      AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$fn$;
-- +goose StatementEnd

-- VoucherPoolCreate (queries/voucher_pool.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_pool_create(p_campaign text, p_kind text, p_total bigint)
RETURNS SETOF pgquota.voucher_pool
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    RETURN QUERY
    INSERT INTO pgquota.voucher_pool (campaign, kind, total)
    VALUES ($1::text, $2::text, $3::bigint)
    ON CONFLICT (campaign) DO NOTHING
    RETURNING campaign, kind, total, claimed, created_at;
END
$fn$;
-- +goose StatementEnd

-- VoucherPoolAddCodes (queries/voucher_pool.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_pool_add_codes(p_added bigint, p_campaign text)
RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    UPDATE pgquota.voucher_pool
    SET total = total + $1::bigint
    WHERE campaign = $2::text;
END
$fn$;
-- +goose StatementEnd

-- VoucherShardCreate (queries/voucher_shard.sql) as pgquota_operator.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_shard_create(p_campaign text, p_shards integer[], p_bases bigint[], p_totals bigint[])
RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    INSERT INTO pgquota.voucher_shard (campaign, shard, base, total)
    SELECT $1::text,
           unnest($2::integer[]),
           unnest($3::bigint[]),
           unnest($4::bigint[]);
END
$fn$;
-- +goose StatementEnd

-- Codes imported into a codes campaign (quota/voucher.go's import, which
-- staged the codes in a temporary table of the caller's): in code order,
-- so that concurrent imports with overlapping codes wait for each other's
-- rows in one order and cannot deadlock.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_import_codes(p_campaign text, p_codes text[])
RETURNS TABLE (imported bigint, total bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
BEGIN
    IF p_campaign IS NULL OR p_codes IS NULL THEN
        RAISE EXCEPTION 'pgquota: campaign and codes must not be NULL' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO pgquota.voucher_code (campaign, code)
        SELECT DISTINCT p_campaign, code FROM unnest(p_codes) AS i(code)
        ORDER BY code
        ON CONFLICT (campaign, code) DO NOTHING
        RETURNING 1
    )
    UPDATE pgquota.voucher_pool
    SET total = total + (SELECT count(*) FROM ins)
    WHERE campaign = p_campaign
    RETURNING (SELECT count(*) FROM ins), total;
END
$fn$;
-- +goose StatementEnd

-- A fence guard's resource registered (quota/fence.go's AttachFenceGuard,
-- after it created the guard's triggers as the table's owner).
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_guard_register(p_resource text, p_external boolean, p_lease text, p_semaphore text)
RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    IF p_resource IS NULL OR p_external IS NULL THEN
        RAISE EXCEPTION 'pgquota: resource and external must not be NULL' USING ERRCODE = '22023';
    END IF;
    -- The binding (00018_guard_binding.sql): the lease or semaphore whose
    -- tokens the resource's guarded tables accept, or neither for external.
    INSERT INTO pgquota.fence_guard_resource AS g (resource, external, lease, semaphore, attached_at)
    VALUES (p_resource, p_external, p_lease, p_semaphore, pgquota.clock())
    ON CONFLICT (resource) DO UPDATE SET external = excluded.external, lease = excluded.lease,
        semaphore = excluded.semaphore, attached_at = excluded.attached_at;
END
$fn$;
-- +goose StatementEnd

-- The allowlist: function (its regprocedure text) and the role that may
-- execute it. Members inherit: pgquota_operator runs what the two others
-- run.
CREATE TABLE pgquota.function_grant (
    function text NOT NULL,
    role     name NOT NULL,
    -- false for a function that runs as its caller on purpose: the guard
    -- trigger, which handles the application table's row (a domain CHECK
    -- or a cast of the application's own) and must never do so with the
    -- owner's rights. It reaches pgquota's state through SECURITY DEFINER
    -- helpers of its own (fence_proof_valid, fence_lease_held).
    definer  boolean NOT NULL DEFAULT true,
    PRIMARY KEY (function, role),
    CONSTRAINT function_grant_role CHECK (role IN ('pgquota_app', 'pgquota_relay', 'pgquota_operator'))
);

INSERT INTO pgquota.function_grant (function, role, definer) VALUES
    ('pgquota.fence_guard_presented()', 'pgquota_operator', false);

INSERT INTO pgquota.function_grant (function, role) VALUES
    ('pgquota.clock()', 'pgquota_app'),
    ('pgquota.clock()', 'pgquota_relay'),
    ('pgquota.local_instant(timestamp without time zone,text)', 'pgquota_app'),
    ('pgquota.window_start(text,text,timestamp with time zone)', 'pgquota_app'),
    ('pgquota.window_end(text,text,timestamp with time zone)', 'pgquota_app'),
    ('pgquota.lease_fresh(text)', 'pgquota_app'),
    ('pgquota.present_token(text,bigint,text)', 'pgquota_app'),
    ('pgquota.durable_commit()', 'pgquota_app'),
    ('pgquota.wal_timeline()', 'pgquota_app'),
    ('pgquota.lease_epoch_now()', 'pgquota_app'),
    ('pgquota.lease_token_ceiling()', 'pgquota_app'),
    ('pgquota.fence_guarded(text)', 'pgquota_app'),
    ('pgquota.grant_limits(text[],text,bigint,bigint)', 'pgquota_app'),
    ('pgquota.slot_lease_name(text,integer)', 'pgquota_app'),
    ('pgquota.slot_acquire(text,integer,text,text,interval)', 'pgquota_app'),
    ('pgquota.lease_wait_register(text,text,interval)', 'pgquota_app'),
    ('pgquota."grant"(text,text,bigint,bigint)', 'pgquota_app'),
    ('pgquota.grant_keyed(text,text,text,text,bigint,bigint)', 'pgquota_app'),
    ('pgquota.revoke(text,text,bigint)', 'pgquota_app'),
    ('pgquota.revoke_keyed(text,text,text,text,bigint)', 'pgquota_app'),
    ('pgquota.compensate_grant(bigint)', 'pgquota_app'),
    ('pgquota.claim(text,text)', 'pgquota_app'),
    ('pgquota.claim_keyed(text,text,text,text)', 'pgquota_app'),
    ('pgquota.grant_limits_batch(text[],integer[],integer[],text[],bigint[],bigint[])', 'pgquota_app'),
    ('pgquota.usage_grant_batch(text[],text[],integer[],integer[],bigint[],bigint[])', 'pgquota_app'),
    ('pgquota.limit_usage(text,text)', 'pgquota_app'),
    ('pgquota.lease_epoch_bump(bigint)', 'pgquota_operator'),
    ('pgquota.lease_epoch_prepare(bigint)', 'pgquota_operator'),
    ('pgquota.lease_epoch_raise(bigint)', 'pgquota_operator'),
    ('pgquota.lease_epoch_standbys(pg_lsn)', 'pgquota_operator'),
    ('pgquota.system_identifier()', 'pgquota_app'),
    ('pgquota.fence_guard()', 'pgquota_operator'),
    ('pgquota.fence_proof_valid(text,bigint,text,text)', 'pgquota_app'),
    ('pgquota.fence_lease_held(text,bigint,text,text)', 'pgquota_app'),
    ('pgquota.fence_binding_error(text,bigint,text,text,text)', 'pgquota_app'),
    ('pgquota.lease_acquire(interval, text, text, text)', 'pgquota_app'),
    ('pgquota.lease_renew(text, bigint, interval)', 'pgquota_app'),
    ('pgquota.lease_release(text, bigint)', 'pgquota_app'),
    ('pgquota.lease_payload_set(text, text, bigint, boolean)', 'pgquota_app'),
    ('pgquota.lease_wait_unregister(text, text)', 'pgquota_app'),
    ('pgquota.fenced_row_write(text, text, text, bigint, text)', 'pgquota_app'),
    ('pgquota.usage_fenced_write(text, text, bigint, bigint, text, bigint, bigint)', 'pgquota_app'),
    ('pgquota.ledger_batch_insert(text[], text[], text[], text[], bigint[], bigint[])', 'pgquota_app'),
    ('pgquota.usage_grant_batch_keyed(text[], text[], integer[], integer[], bigint[], bigint[], bigint[])', 'pgquota_app'),
    ('pgquota.outbox_enqueue(text, bytea, bigint, text, text, bigint)', 'pgquota_app'),
    ('pgquota.outbox_claim(text[], int)', 'pgquota_relay'),
    ('pgquota.outbox_mark_delivered(bigint[])', 'pgquota_relay'),
    ('pgquota.outbox_mark_failed(int, bigint[], text[], bigint[])', 'pgquota_relay'),
    ('pgquota.outbox_reap(bigint, int)', 'pgquota_relay'),
    ('pgquota.ledger_reap(bigint, int)', 'pgquota_operator'),
    ('pgquota.lease_reap(bigint, int, boolean)', 'pgquota_operator'),
    ('pgquota.quota_define(text, text, bigint, text, boolean)', 'pgquota_operator'),
    ('pgquota.quota_shape_define(text, text, bigint, bigint, bigint, timestamptz, boolean)', 'pgquota_operator'),
    ('pgquota.quota_override_set(text, bigint, text)', 'pgquota_operator'),
    ('pgquota.quota_override_delete(text, text)', 'pgquota_operator'),
    ('pgquota.voucher_pool_create(text, text, bigint)', 'pgquota_operator'),
    ('pgquota.voucher_pool_add_codes(bigint, text)', 'pgquota_operator'),
    ('pgquota.voucher_shard_create(text, integer[], bigint[], bigint[])', 'pgquota_operator'),
    ('pgquota.voucher_import_codes(text,text[])', 'pgquota_operator'),
    ('pgquota.fence_guard_register(text,boolean,text,text)', 'pgquota_operator'),
    ('pgquota.fence_guards()', 'pgquota_app'),
    ('pgquota.grant_row(text,text,bigint,bigint)', 'pgquota_app'),
    ('pgquota.grant_keyed_row(text,text,text,text,bigint,bigint)', 'pgquota_app'),
    ('pgquota.limit_usage_row(text,text)', 'pgquota_app');

-- pgquota.grant_roles applies the privilege model to every pgquota role
-- that exists, on every object of the schema now. Idempotent; executable by
-- the owner only.
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_roles() RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    r name;
    g record;
BEGIN
    EXECUTE 'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota FROM PUBLIC';
    FOREACH r IN ARRAY ARRAY['pgquota_app', 'pgquota_relay', 'pgquota_operator']::name[] LOOP
        CONTINUE WHEN to_regrole(r) IS NULL;
        EXECUTE format('GRANT USAGE ON SCHEMA pgquota TO %I', r);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgquota FROM %I', r);
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA pgquota TO %I', r);
        -- The key of the presented-token proofs (00018) is the owner's alone.
        IF to_regclass('pgquota.fence_secret') IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON pgquota.fence_secret FROM %I', r);
        END IF;
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgquota FROM %I', r);
        EXECUTE format('REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota FROM %I', r);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON TABLES FROM %I', r);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT SELECT ON TABLES TO %I', r);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON SEQUENCES FROM %I', r);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON FUNCTIONS FROM %I', r);
    END LOOP;
    FOR g IN SELECT f.function, f.role, f.definer, to_regprocedure(f.function) AS fn
             FROM pgquota.function_grant f ORDER BY f.function, f.role LOOP
        IF g.fn IS NULL THEN
            RAISE EXCEPTION 'pgquota: function % of pgquota.function_grant does not exist', g.function
                USING ERRCODE = '42883';
        END IF;
        IF g.definer THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgquota, pg_temp', g.fn);
        ELSE
            EXECUTE format('ALTER FUNCTION %s SECURITY INVOKER SET search_path = pg_catalog, pgquota, pg_temp', g.fn);
        END IF;
        IF to_regrole(g.role) IS NOT NULL THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', g.fn, g.role);
        END IF;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- pgquota.grant_app (00010, used by `pgquota migrate grant-app`) applies the
-- model above instead of granting table DML.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_app(p_role name DEFAULT 'pgquota_app') RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM pgquota.grant_roles();
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    r name;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgquota_relay', 'pgquota_operator']::name[] LOOP
        IF to_regrole(r) IS NULL THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE WARNING USING
                        MESSAGE = format('pgquota: role %s does not exist and role %s may not create it: '
                                         'it was granted nothing', r, current_user),
                        HINT = 'As a role with CREATEROLE run CREATE ROLE pgquota_relay NOLOGIN; CREATE ROLE pgquota_operator NOLOGIN; '
                               'GRANT pgquota_app, pgquota_relay TO pgquota_operator, '
                               'then as the owner of schema pgquota run pgquota migrate grant-operator.';
            END;
        END IF;
    END LOOP;
    IF to_regrole('pgquota_operator') IS NOT NULL THEN
        BEGIN
            IF to_regrole('pgquota_app') IS NOT NULL AND NOT pg_has_role('pgquota_operator', 'pgquota_app', 'MEMBER') THEN
                GRANT pgquota_app TO pgquota_operator;
            END IF;
            IF to_regrole('pgquota_relay') IS NOT NULL AND NOT pg_has_role('pgquota_operator', 'pgquota_relay', 'MEMBER') THEN
                GRANT pgquota_relay TO pgquota_operator;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING USING
                MESSAGE = format('pgquota: role %s may not make pgquota_operator a member of pgquota_app and pgquota_relay', current_user),
                HINT = 'As a role with CREATEROLE run GRANT pgquota_app, pgquota_relay TO pgquota_operator.';
        END;
    END IF;
    PERFORM pgquota.grant_roles();
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The roles stay (other databases of the server may use them).
-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
    r name;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = 'pgquota'::regnamespace AND p.prokind = 'f' LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY INVOKER RESET search_path', f);
    END LOOP;
    FOREACH r IN ARRAY ARRAY['pgquota_relay', 'pgquota_operator']::name[] LOOP
        CONTINUE WHEN to_regrole(r) IS NULL;
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON TABLES FROM %I', r);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgquota FROM %I', r);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgquota FROM %I', r);
        EXECUTE format('REVOKE ALL ON SCHEMA pgquota FROM %I', r);
    END LOOP;
    EXECUTE 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota TO PUBLIC';
END
$$;
-- +goose StatementEnd
DROP FUNCTION pgquota.grant_roles();
DROP TABLE pgquota.function_grant;
DROP FUNCTION pgquota.fence_guard_register(text, boolean, text, text);
DROP FUNCTION pgquota.voucher_import_codes(text, text[]);
DROP FUNCTION pgquota.lease_acquire(interval, text, text, text);
DROP FUNCTION pgquota.lease_args_check(text, text, interval, text, text, boolean);
DROP FUNCTION pgquota.lease_renew(text, bigint, interval);
DROP FUNCTION pgquota.lease_release(text, bigint);
DROP FUNCTION pgquota.lease_payload_set(text, text, bigint, boolean);
DROP FUNCTION pgquota.lease_wait_unregister(text, text);
DROP FUNCTION pgquota.fenced_row_write(text, text, text, bigint, text);
DROP FUNCTION pgquota.usage_fenced_write(text, text, bigint, bigint, text, bigint, bigint);
DROP FUNCTION pgquota.ledger_batch_insert(text[], text[], text[], text[], bigint[], bigint[]);
DROP FUNCTION pgquota.usage_grant_batch_keyed(text[], text[], integer[], integer[], bigint[], bigint[], bigint[]);
DROP FUNCTION pgquota.outbox_enqueue(text, bytea, bigint, text, text, bigint);
DROP FUNCTION pgquota.outbox_claim(text[], int);
DROP FUNCTION pgquota.outbox_mark_delivered(bigint[]);
DROP FUNCTION pgquota.outbox_mark_failed(int, bigint[], text[], bigint[]);
DROP FUNCTION pgquota.outbox_reap(bigint, int);
DROP FUNCTION pgquota.ledger_reap(bigint, int);
DROP FUNCTION pgquota.lease_reap(bigint, int, boolean);
DROP FUNCTION pgquota.quota_define(text, text, bigint, text, boolean);
DROP FUNCTION pgquota.quota_shape_define(text, text, bigint, bigint, bigint, timestamptz, boolean);
DROP FUNCTION pgquota.quota_override_set(text, bigint, text);
DROP FUNCTION pgquota.quota_override_delete(text, text);
DROP FUNCTION pgquota.voucher_pool_create(text, text, bigint);
DROP FUNCTION pgquota.voucher_pool_add_codes(bigint, text);
DROP FUNCTION pgquota.voucher_shard_create(text, integer[], bigint[], bigint[]);
DROP TABLE pgquota.outbox_claimed;
DROP TABLE pgquota.quota_shape_defined;
-- grant_app as 00018 defined it, and what it granted.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_app(p_role name DEFAULT 'pgquota_app') RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT USAGE, SELECT ON SEQUENCES TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT EXECUTE ON FUNCTIONS TO %I', p_role);
    -- The version table is read (CheckSchema, migrate status), never written.
    IF to_regclass('pgquota.pgquota_migrations') IS NOT NULL THEN
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON pgquota.pgquota_migrations FROM %I', p_role);
    END IF;
    -- The key of the proofs of presentation, and the function that mints
    -- them (00018_guard_binding.sql): never the application's.
    IF to_regclass('pgquota.fence_secret') IS NOT NULL THEN
        EXECUTE format('REVOKE ALL ON pgquota.fence_secret FROM %I', p_role);
        EXECUTE format('REVOKE ALL ON FUNCTION pgquota.fence_proof(text, bigint, text) FROM %I', p_role);
    END IF;
    -- Granting is the owner's business.
    EXECUTE format('REVOKE EXECUTE ON FUNCTION pgquota.grant_app(name) FROM PUBLIC, %I', p_role);
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regrole('pgquota_app') IS NOT NULL THEN
        PERFORM pgquota.grant_app('pgquota_app');
    END IF;
END
$$;
-- +goose StatementEnd
