-- The bodies of pgquota's calls on a Citus coordinator, applied by Up
-- (migrations/citus.go) after the tables are distributed, each time it runs
-- there; never on plain PostgreSQL. Same names, arguments, results,
-- privileges and guarantees as the goose migrations' versions; each
-- statement on a distributed table names one distribution value (routes to
-- one shard) and carries the clock as a PL/pgSQL variable (a parameter):
-- Citus refuses a VOLATILE function (pgquota.clock()) in the SET, WHERE,
-- ON CONFLICT and RETURNING clauses of a modification of a distributed
-- table, and pg_notify in RETURNING.
--
-- The decision instant is read after the row lock, as in the one-statement
-- versions (the lease's row is locked with FOR UPDATE first, a one-shard
-- query), so a call that waited for the lock decides on the time it got it.

-- pgquota.clock: 00001_quota.sql. Every decision reads it (after its row
-- locks); on Citus it refuses a client connected to a worker node, whose
-- clock is not the coordinator's: pgquota runs on the coordinator only
-- (CheckSchema, every command and the lease bodies below refuse a worker
-- too). A worker still evaluates it for the coordinator's own distributed
-- queries (a SELECT routed to a shard carries it): those come over
-- Citus's internal connections, application_name "citus_internal
-- gpid=..." (Citus's CITUS_APPLICATION_NAME_PREFIX). A client that sets
-- that name itself only chooses the worker's clock: the limits stay exact.
CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    AS $fn$
BEGIN
    IF NOT citus_is_coordinator() AND NOT starts_with(current_setting('application_name'), 'citus_internal gpid=') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ021',
            MESSAGE = 'pgquota: a call on a Citus worker node: pgquota runs on the coordinator only (every decision reads the coordinator''s clock)';
    END IF;
    RETURN clock_timestamp();
END
$fn$;

-- pgquota.lease_acquire: 00022_app_role_lockdown.sql.
CREATE OR REPLACE FUNCTION pgquota.lease_acquire(p_ttl interval, p_name text, p_holder text, p_attempt text)
RETURNS TABLE (taken boolean, name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_cur   pgquota.lease;
    v_now   timestamptz;
    v_token bigint;
    v_found boolean;
BEGIN
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ021',
            MESSAGE = 'pgquota: lease_acquire on a Citus worker node: pgquota runs on the coordinator only (its token sequence, which orders every lease''s tokens, and the advisory locks that order acquisitions are the coordinator''s)';
    END IF;
    PERFORM pgquota.lease_args_check('lease_acquire', p_name, p_ttl, p_holder, p_attempt, true);
    IF starts_with(p_name, 'slot:') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ012',
            MESSAGE = format('pgquota: lease %s is a semaphore slot: acquire it with AcquireSlot (pgquota slot acquire), not as a lease', left(p_name, 255)),
            DETAIL  = json_build_object('lease', left(p_name, 255))::text;
    END IF;
    PERFORM pgquota.durable_commit();
    -- Acquirers of one name queue here (on the coordinator, where every
    -- call runs), then on the lease's row.
    PERFORM pg_advisory_xact_lock(hashtextextended('pgquota.lease:' || p_name, 0));
    SELECT * INTO v_cur FROM pgquota.lease l WHERE l.name = p_name FOR UPDATE;
    v_found := FOUND;
    v_now := pgquota.clock();
    IF NOT v_found THEN
        v_token := pgquota.next_lease_token();
        INSERT INTO pgquota.lease (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
        VALUES (p_name, p_holder, p_attempt, v_token, v_now, v_now, v_now + p_ttl)
        RETURNING * INTO v_cur;
    ELSIF v_cur.expires_at > v_now AND v_cur.attempt <> p_attempt THEN
        -- Held by someone else: not taken, nothing written.
        RETURN QUERY SELECT false, v_cur.name, v_cur.holder, v_cur.attempt, v_cur.token, v_cur.acquired_at,
                            v_cur.renewed_at, v_cur.expires_at, pgquota.clock();
        RETURN;
    ELSIF v_cur.expires_at > v_now THEN
        -- The same attempt again, still live: the lease as it is.
        UPDATE pgquota.lease l SET holder = p_holder, attempt = p_attempt
        WHERE l.name = p_name
        RETURNING * INTO v_cur;
    ELSE
        v_token := pgquota.next_lease_token();
        UPDATE pgquota.lease l
        SET holder = p_holder, attempt = p_attempt, token = v_token,
            acquired_at = v_now, renewed_at = v_now, expires_at = v_now + p_ttl
        WHERE l.name = p_name
        RETURNING * INTO v_cur;
    END IF;
    -- The fence of the resource named like the lease, unless a guarded
    -- table binds it to another source of tokens (00018_guard_binding.sql).
    IF NOT EXISTS (
        SELECT 1 FROM pgquota.fence_guard_resource g
        WHERE g.resource = v_cur.name AND (g.external OR g.semaphore IS NOT NULL OR g.lease <> v_cur.name)
    ) THEN
        INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
        VALUES (v_cur.name, v_cur.token, v_now)
        ON CONFLICT (resource) DO UPDATE
        SET max_token  = excluded.max_token,
            updated_at = excluded.updated_at
        WHERE f.max_token < excluded.max_token;
    END IF;
    RETURN QUERY SELECT true, v_cur.name, v_cur.holder, v_cur.attempt, v_cur.token, v_cur.acquired_at,
                        v_cur.renewed_at, v_cur.expires_at, pgquota.clock();
END
$fn$;

-- pgquota.lease_renew: 00022_app_role_lockdown.sql.
CREATE OR REPLACE FUNCTION pgquota.lease_renew(p_name text, p_token bigint, p_ttl interval)
RETURNS TABLE (name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz, prev_expires_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_prev timestamptz;
    v_now  timestamptz;
    v_cur  pgquota.lease;
BEGIN
    PERFORM pgquota.lease_args_check('lease_renew', p_name, p_ttl, NULL, NULL, false);
    SELECT l.expires_at INTO v_prev FROM pgquota.lease l
    WHERE l.name = p_name AND l.token = p_token
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_now := pgquota.clock();
    IF v_prev <= v_now THEN
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    UPDATE pgquota.lease l
    SET renewed_at = v_now, expires_at = v_now + p_ttl
    WHERE l.name = p_name AND l.token = p_token
    RETURNING * INTO v_cur;
    RETURN QUERY SELECT v_cur.name, v_cur.holder, v_cur.attempt, v_cur.token, v_cur.acquired_at,
                        v_cur.renewed_at, v_cur.expires_at, v_now, v_prev;
END
$fn$;

-- pgquota.lease_release: 00022_app_role_lockdown.sql.
CREATE OR REPLACE FUNCTION pgquota.lease_release(p_name text, p_token bigint)
RETURNS TABLE (name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz, notified boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_now timestamptz;
    v_cur pgquota.lease;
BEGIN
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ021',
            MESSAGE = 'pgquota: lease_release on a Citus worker node: pgquota runs on the coordinator only (the advisory lock that orders a release with the waiters it must wake is the coordinator''s)';
    END IF;
    PERFORM 1 FROM pgquota.lease l WHERE l.name = p_name AND l.token = p_token FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_now := pgquota.clock();
    PERFORM pgquota.durable_commit();
    UPDATE pgquota.lease l
    SET expires_at = least(l.expires_at, v_now)
    WHERE l.name = p_name AND l.token = p_token
    RETURNING * INTO v_cur;
    RETURN QUERY SELECT v_cur.name, v_cur.holder, v_cur.attempt, v_cur.token, v_cur.acquired_at,
                        v_cur.renewed_at, v_cur.expires_at, v_now, pgquota.lease_notify_waiters(v_cur.name);
END
$fn$;

-- pgquota.quota_define: 00014_sql_interface.sql and later. No row, and
-- nothing written, when the zone is unknown or when the quota exists with
-- another kind and p_replace_kind is false; with it, a change of kind
-- deletes the quota's counters first (a statement over every shard of
-- usage, in the same transaction).
CREATE OR REPLACE FUNCTION pgquota.quota_define(p_name text, p_window_unit text, p_default_limit bigint, p_time_zone text, p_replace_kind boolean)
RETURNS SETOF pgquota.quota
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_prev text;
    v_tz   text;
    v_now  timestamptz;
BEGIN
    SELECT z.name INTO v_tz FROM pg_catalog.pg_timezone_names z
    WHERE lower(z.name) = lower(p_time_zone)
    ORDER BY z.name = p_time_zone DESC, z.name
    LIMIT 1;
    IF v_tz IS NULL THEN
        RETURN;
    END IF;
    SELECT p.window_unit INTO v_prev FROM pgquota.quota p WHERE p.name = p_name FOR UPDATE;
    IF v_prev IS NOT NULL AND v_prev <> p_window_unit AND NOT p_replace_kind THEN
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    v_now := pgquota.clock();
    IF v_prev IS NOT NULL AND v_prev <> p_window_unit THEN
        -- One connection per worker: the transaction writes a reference
        -- table next, which Citus refuses after parallel DML.
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        DELETE FROM pgquota.usage u WHERE u.quota_name = p_name;
    END IF;
    RETURN QUERY
    INSERT INTO pgquota.quota AS q (name, window_unit, time_zone, default_limit)
    VALUES (p_name, p_window_unit, v_tz, p_default_limit)
    ON CONFLICT (name) DO UPDATE
    SET window_unit   = excluded.window_unit,
        time_zone     = excluded.time_zone,
        default_limit = excluded.default_limit,
        updated_at    = v_now
    RETURNING q.name, q.window_unit, q.time_zone, q.default_limit, q.created_at, q.updated_at;
END
$fn$;

-- pgquota.quota_shape_define: 00011_limit_shapes.sql and later, as
-- quota_define above.
CREATE OR REPLACE FUNCTION pgquota.quota_shape_define(p_name text, p_window_unit text, p_default_limit bigint, p_period_us bigint, p_burst bigint, p_origin timestamptz, p_replace_kind boolean)
RETURNS SETOF pgquota.quota_shape_defined
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_prev text;
    v_now  timestamptz;
    v_q    pgquota.quota;
    v_s    pgquota.quota_shape;
BEGIN
    SELECT p.window_unit INTO v_prev FROM pgquota.quota p WHERE p.name = p_name FOR UPDATE;
    IF v_prev IS NOT NULL AND v_prev <> p_window_unit AND NOT p_replace_kind THEN
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    v_now := pgquota.clock();
    IF v_prev IS NOT NULL AND v_prev <> p_window_unit THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        DELETE FROM pgquota.usage u WHERE u.quota_name = p_name;
        DELETE FROM pgquota.rate_state rs WHERE rs.quota_name = p_name;
        DELETE FROM pgquota.rolling_usage ru WHERE ru.quota_name = p_name;
    END IF;
    INSERT INTO pgquota.quota AS q (name, window_unit, time_zone, default_limit)
    VALUES (p_name, p_window_unit, 'UTC', p_default_limit)
    ON CONFLICT (name) DO UPDATE
    SET window_unit   = excluded.window_unit,
        time_zone     = excluded.time_zone,
        default_limit = excluded.default_limit,
        updated_at    = v_now
    RETURNING * INTO v_q;
    INSERT INTO pgquota.quota_shape AS s (quota_name, period_us, burst, origin)
    VALUES (p_name, p_period_us, p_burst, p_origin)
    ON CONFLICT (quota_name) DO UPDATE
    SET period_us  = excluded.period_us,
        burst      = excluded.burst,
        origin     = excluded.origin,
        updated_at = v_now
    RETURNING * INTO v_s;
    RETURN QUERY SELECT v_q.name, v_q.window_unit, v_q.time_zone, v_q.default_limit, v_q.created_at, v_q.updated_at,
                        v_s.period_us, v_s.burst, v_s.origin;
END
$fn$;

-- pgquota.quota_override_set: 00014_sql_interface.sql and later.
CREATE OR REPLACE FUNCTION pgquota.quota_override_set(p_member text, p_limit_value bigint, p_quota_name text)
RETURNS SETOF pgquota.quota_override
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM 1 FROM pgquota.quota q WHERE q.name = p_quota_name FOR SHARE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    v_now := pgquota.clock();
    RETURN QUERY
    INSERT INTO pgquota.quota_override AS o (quota_name, member, limit_value)
    VALUES (p_quota_name, p_member, p_limit_value)
    ON CONFLICT (quota_name, member) DO UPDATE
    SET limit_value = excluded.limit_value,
        updated_at  = v_now
    RETURNING o.quota_name, o.member, o.limit_value, o.updated_at;
END
$fn$;

-- pgquota.quota_override_delete: 00014_sql_interface.sql and later.
CREATE OR REPLACE FUNCTION pgquota.quota_override_delete(p_quota_name text, p_member text)
RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_rows bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    DELETE FROM pgquota.quota_override o WHERE o.quota_name = p_quota_name AND o.member = p_member;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$fn$;

-- pgquota.slot_lease_guard: 00012_slots.sql. The trigger runs on the
-- worker holding the lease's shard, which cannot see the coordinator's
-- transaction settings (pgquota.slot_taking, set by slot_acquire), so on
-- Citus it lets every row through. Slot names stay reserved all the same:
-- the lease API's Citus body (lease_acquire, above) refuses any name
-- starting with "slot:" (PQ012), and the application role has no
-- privilege on pgquota.lease (00022), so only slot_acquire writes them.
CREATE OR REPLACE FUNCTION pgquota.slot_lease_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    RETURN NEW;
END
$fn$;

-- pgquota.slot_acquire: 00022_app_role_lockdown.sql, without the
-- pgquota.slot_taking setting (see slot_lease_guard above) and with the
-- clock in variables.
CREATE OR REPLACE FUNCTION pgquota.slot_acquire(p_name text, p_limit integer, p_holder text, p_attempt text, p_ttl interval)
RETURNS TABLE(taken boolean, slot integer, lease_name text, holder text, attempt text, token bigint, acquired_at timestamp with time zone, renewed_at timestamp with time zone, expires_at timestamp with time zone, db_now timestamp with time zone, holders integer, next_expiry timestamp with time zone)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_sem   pgquota.semaphore;
    v_row   pgquota.lease;
    v_at    timestamptz;
    v_held  integer;
    v_next  timestamptz;
    v_slot  text;
    v_token bigint;
    v_found boolean;
BEGIN
    IF p_name IS NULL OR octet_length(p_name) NOT BETWEEN 1 AND 240 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pgquota: slot_acquire: the semaphore name must be 1 to 240 bytes';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota: slot_acquire: the limit must be 1 to 1000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    IF p_holder IS NULL OR p_holder = '' OR p_attempt IS NULL OR p_attempt = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pgquota: slot_acquire: the holder and the attempt must not be empty';
    END IF;
    IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota: slot_acquire: the ttl must be positive, got %s', coalesce(p_ttl::text, 'NULL'));
    END IF;
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ021',
            MESSAGE = 'pgquota: slot_acquire on a Citus worker node: pgquota runs on the coordinator only (its token sequence and the advisory locks that order acquisitions are the coordinator''s)';
    END IF;
    PERFORM pgquota.durable_commit();

    -- Before any lock, from the statement's snapshot: a retry of an
    -- attempt that holds a slot gets it back, and a semaphore full at the
    -- limit it was last given answers "full" without a lock and without a
    -- write. Both are safe without the lock: the attempt's slot is its
    -- own; and this count only ever decides a refusal, never a take: it
    -- may miss a release committed since the snapshot (a refusal that
    -- the caller retries), and when it misses an acquire and finds room,
    -- the locked path below counts again. Waiters poll here without
    -- queueing on the semaphore's row.
    v_at := pgquota.clock();
    SELECT * INTO v_sem FROM pgquota.semaphore s WHERE s.name = p_name;
    IF FOUND THEN
        SELECT l.* INTO v_row
        FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
        JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
        WHERE l.attempt = p_attempt AND l.expires_at > v_at
        LIMIT 1;
        v_found := FOUND;
        SELECT count(*), min(l.expires_at) INTO v_held, v_next
        FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
        JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
        WHERE l.expires_at > v_at;
        IF v_found THEN
            RETURN QUERY SELECT true, substring(v_row.name FROM '[0-9]+$')::integer, v_row.name, v_row.holder, v_row.attempt,
                                v_row.token, v_row.acquired_at, v_row.renewed_at, v_row.expires_at, v_at, v_held,
                                NULL::timestamptz;
            RETURN;
        END IF;
        IF v_held >= p_limit AND v_sem.slot_limit = p_limit THEN
            RETURN QUERY SELECT false, -1, ''::text, ''::text, ''::text, 0::bigint, NULL::timestamptz,
                                NULL::timestamptz, NULL::timestamptz, v_at, v_held, v_next;
            RETURN;
        END IF;
    END IF;

    LOOP
        SELECT * INTO v_sem FROM pgquota.semaphore s WHERE s.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
        v_at := pgquota.clock();
        INSERT INTO pgquota.semaphore (name, slot_limit, slots, created_at, updated_at)
        VALUES (p_name, p_limit, p_limit, v_at, v_at)
        ON CONFLICT (name) DO NOTHING;
    END LOOP;

    v_at := pgquota.clock();
    -- The same attempt again (committed while this call waited for the
    -- lock): its slot, unchanged.
    SELECT l.* INTO v_row
    FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
    JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
    WHERE l.attempt = p_attempt AND l.expires_at > v_at
    LIMIT 1;
    IF FOUND THEN
        SELECT count(*) INTO v_held
        FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
        JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
        WHERE l.expires_at > v_at;
        RETURN QUERY SELECT true, substring(v_row.name FROM '[0-9]+$')::integer, v_row.name, v_row.holder, v_row.attempt,
                            v_row.token, v_row.acquired_at, v_row.renewed_at, v_row.expires_at, v_at, v_held,
                            NULL::timestamptz;
        RETURN;
    END IF;

    SELECT count(*), min(l.expires_at) INTO v_held, v_next
    FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
    JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
    WHERE l.expires_at > v_at;

    IF v_held < p_limit THEN
        FOR i IN 0 .. p_limit - 1 LOOP
            v_slot := pgquota.slot_lease_name(p_name, i);
            SELECT * INTO v_row FROM pgquota.lease l WHERE l.name = v_slot FOR UPDATE SKIP LOCKED;
            v_found := FOUND;
            IF NOT v_found THEN
                CONTINUE WHEN EXISTS (SELECT 1 FROM pgquota.lease l WHERE l.name = v_slot);
                -- Absent. The lease acquirers' advisory lock on the name
                -- (queries/lease.sql), which the reaper also tries.
                PERFORM pg_advisory_xact_lock(hashtextextended('pgquota.lease:' || v_slot, 0));
            END IF;
            v_at := pgquota.clock();
            CONTINUE WHEN v_found AND v_row.expires_at > v_at;
            v_token := pgquota.next_lease_token();
            v_at := pgquota.clock();
            IF v_found THEN
                UPDATE pgquota.lease l
                SET holder = p_holder, attempt = p_attempt, token = v_token,
                    acquired_at = v_at, renewed_at = v_at, expires_at = v_at + p_ttl
                WHERE l.name = v_slot
                RETURNING l.* INTO v_row;
            ELSE
                INSERT INTO pgquota.lease AS l (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
                VALUES (v_slot, p_holder, p_attempt, v_token, v_at, v_at, v_at + p_ttl)
                ON CONFLICT (name) DO NOTHING
                RETURNING l.* INTO v_row;
                v_found := FOUND;
            END IF;
            -- Inserted meanwhile: the lease API refuses slot names (its
            -- Citus body); pass over it all the same.
            CONTINUE WHEN NOT v_found;
            INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
            VALUES (v_slot, v_token, v_at)
            ON CONFLICT (resource) DO UPDATE
            SET max_token = excluded.max_token, updated_at = excluded.updated_at
            WHERE f.max_token < excluded.max_token;
            UPDATE pgquota.semaphore s
            SET slot_limit = p_limit, slots = greatest(s.slots, p_limit),
                acquisitions = s.acquisitions + 1, updated_at = v_at
            WHERE s.name = p_name;
            RETURN QUERY SELECT true, i, v_row.name, v_row.holder, v_row.attempt, v_row.token, v_row.acquired_at,
                                v_row.renewed_at, v_row.expires_at, pgquota.clock(), v_held + 1, NULL::timestamptz;
            RETURN;
        END LOOP;
        -- Fewer than p_limit held, but every free slot's row was locked
        -- by another session.
        v_next := NULL;
    END IF;
    IF v_sem.slot_limit <> p_limit THEN
        v_at := pgquota.clock();
        UPDATE pgquota.semaphore s
        SET slot_limit = p_limit, slots = greatest(s.slots, p_limit), updated_at = v_at
        WHERE s.name = p_name;
    END IF;
    RETURN QUERY SELECT false, -1, ''::text, ''::text, ''::text, 0::bigint, NULL::timestamptz,
                        NULL::timestamptz, NULL::timestamptz, pgquota.clock(), v_held, v_next;
END
$fn$;

-- pgquota.lease_payload_set: 00022_app_role_lockdown.sql. The lease's row
-- is locked first (one shard), then the clock is read.
CREATE OR REPLACE FUNCTION pgquota.lease_payload_set(p_payload text, p_name text, p_token bigint, p_require_held boolean)
RETURNS TABLE (name text, holder text, attempt text, token bigint, acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz, db_now timestamptz, payload text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM pgquota.durable_commit();
    PERFORM 1 FROM pgquota.lease l WHERE l.name = p_name FOR UPDATE;
    v_now := pgquota.clock();
    RETURN QUERY
    UPDATE pgquota.lease l
    SET payload = p_payload,
        payload_token = l.token
    WHERE l.name = p_name
      AND l.token = p_token
      AND (NOT p_require_held OR l.expires_at > v_now)
    RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, v_now AS db_now,
              coalesce(l.payload, '')::text AS payload;
END
$fn$;

-- pgquota.compensate_grant: 00022_app_role_lockdown.sql, with the clock
-- read into a variable after the outcome's row is locked.
CREATE OR REPLACE FUNCTION pgquota.compensate_grant(p_grant_id bigint)
RETURNS TABLE(grant_id bigint, target text, member text, amount bigint, granted boolean, window_start timestamp with time zone, window_end timestamp with time zone, revoked_now boolean, compensated bigint, compensated_used bigint, compensated_at timestamp with time zone, written_used bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    g      record;
    v_cur  bigint;
    v_comp bigint;
    v_left bigint;
    v_at   timestamptz;
    v_used bigint;
BEGIN
    IF p_grant_id IS NULL OR p_grant_id < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota.compensate_grant: p_grant_id must be at least 1, got %s', coalesce(p_grant_id::text, 'NULL'));
    END IF;
    SELECT l.grant_id AS id, l.target AS quota, l.member AS who, l.amount AS units, o.granted AS ok,
           o.window_start AS ws, o.window_end AS we
    INTO g
    FROM pgquota.ledger l
    JOIN pgquota.ledger_outcome o ON o.grant_id = l.grant_id
    WHERE l.grant_id = p_grant_id
      AND l.operation = 'grant';
    IF g.id IS NULL THEN
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    IF g.ok THEN
        SELECT u.used INTO v_cur
        FROM pgquota.usage u
        WHERE u.quota_name = g.quota AND u.member = g.who
          AND u.window_start = g.ws AND u.window_end = g.we
        FOR UPDATE;
    END IF;
    -- Citus: the outcome's row is locked first, then the clock is read
    -- (a VOLATILE function in SET is refused on a distributed table).
    PERFORM 1 FROM pgquota.ledger_outcome o WHERE o.grant_id = g.id FOR UPDATE;
    v_at := pgquota.clock();
    UPDATE pgquota.ledger_outcome AS o
    SET compensated = least(coalesce(v_cur, 0), g.units),
        compensated_used = coalesce(v_cur, 0) - least(coalesce(v_cur, 0), g.units),
        compensated_at = v_at
    WHERE o.grant_id = g.id
      AND o.compensated_at IS NULL
    RETURNING o.compensated, o.compensated_used, o.compensated_at INTO v_comp, v_left, v_at;
    IF NOT FOUND THEN
        v_at := NULL;
    END IF;
    IF v_at IS NOT NULL AND v_comp > 0 THEN
        -- least(): kept from the single-statement form this function
        -- replaces (queries/ledger.sql, LedgerRevokeGrant), where
        -- PostgreSQL computed the new row from the version in the
        -- statement's snapshot, which could hold fewer units than the
        -- locked one, and checked it against usage_used_nonnegative before
        -- re-evaluating SET on the locked version. Here the UPDATE takes
        -- its snapshot after the lock (READ COMMITTED), so it reads the
        -- locked version, on which least() is v_comp itself (v_cur >=
        -- v_comp); least() keeps the write from failing the check should a
        -- snapshot ever predate the lock.
        UPDATE pgquota.usage AS u
        SET used = u.used - least(u.used, v_comp),
            updated_at = v_at
        WHERE u.quota_name = g.quota AND u.member = g.who
          AND u.window_start = g.ws AND u.window_end = g.we
        RETURNING u.used INTO v_used;
    END IF;
    RETURN QUERY SELECT g.id, g.quota, g.who, g.units, g.ok, g.ws, g.we, v_at IS NOT NULL,
                        coalesce(v_comp, 0), coalesce(v_left, 0), v_at, coalesce(v_used, -1);
END
$fn$;

-- pgquota.usage_grant_batch: 00020_decision_instant.sql. Same arguments,
-- rows and decisions; on Citus every statement names one counter (one
-- shard): a multi-shard SELECT ... FOR UPDATE is refused. The counters are
-- decided one after another in (quota, member) order, so two batches never
-- wait on each other in a cycle, each locked by a one-shard SELECT ... FOR
-- NO KEY UPDATE (a missing counter inserted with ON CONFLICT DO NOTHING and
-- locked by the next pass), its calls decided in order by greedy_take on
-- the locked value, as one call at a time would. The decision instant is
-- read after every lock is held; when a window boundary passed meanwhile
-- the pass's writes are undone (the rows are still held) and the batch is
-- decided again in the new instant's windows, as the plain body does.
CREATE OR REPLACE FUNCTION pgquota.usage_grant_batch(
    p_quota_names text[], p_members text[], p_firsts integer[], p_counts integer[],
    p_amounts bigint[], p_limits bigint[]
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
    v_n     integer := coalesce(cardinality(p_quota_names), 0);
    v_order integer[];
    v_at    timestamptz;
    v_now   timestamptz;
    v_lo    timestamptz;
    v_hi    timestamptz;
    v_lim   bigint;
    v_ws    timestamptz;
    v_we    timestamptz;
    v_am    bigint[];
    v_li    bigint[];
    v_used  bigint;
    v_take  bigint;
    v_ok    boolean;
    i       integer;
    o_i     integer[];
    o_lim   bigint[];
    o_ws    timestamptz[];
    o_we    timestamptz[];
    o_wr    boolean[];
    o_bef   bigint[];
    o_aft   bigint[];
BEGIN
    v_order := array(SELECT t.i FROM generate_series(1, v_n) t(i)
                     ORDER BY p_quota_names[t.i], p_members[t.i], t.i);
    v_at := pgquota.clock();
    LOOP
        v_lo := '-infinity';
        v_hi := 'infinity';
        o_i := '{}'; o_lim := '{}'; o_ws := '{}'; o_we := '{}'; o_wr := '{}'; o_bef := '{}'; o_aft := '{}';
        FOREACH i IN ARRAY v_order LOOP
            SELECT coalesce(o.limit_value, q.default_limit),
                   pgquota.window_start(q.window_unit, q.time_zone, v_at),
                   pgquota.window_end(q.window_unit, q.time_zone, v_at)
            INTO v_lim, v_ws, v_we
            FROM pgquota.quota q
            LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = p_members[i]
            WHERE q.name = p_quota_names[i];
            CONTINUE WHEN NOT FOUND;  -- no such quota: no row for the counter
            v_am := p_amounts[p_firsts[i] : p_firsts[i] + p_counts[i] - 1];
            v_li := p_limits[p_firsts[i] : p_firsts[i] + p_counts[i] - 1];
            LOOP
                SELECT u.used INTO v_used FROM pgquota.usage u
                WHERE u.quota_name = p_quota_names[i] AND u.member = p_members[i]
                  AND u.window_start = v_ws AND u.window_end = v_we
                FOR NO KEY UPDATE;
                IF FOUND THEN
                    v_take := pgquota.greedy_take(v_used, v_am, v_li, v_lim);
                    IF v_take > 0 THEN
                        UPDATE pgquota.usage u SET used = v_used + v_take, updated_at = v_at
                        WHERE u.quota_name = p_quota_names[i] AND u.member = p_members[i]
                          AND u.window_start = v_ws AND u.window_end = v_we;
                    END IF;
                    v_ok := v_take > 0;
                    EXIT;
                END IF;
                v_take := pgquota.greedy_take(0, v_am, v_li, v_lim);
                IF v_take = 0 THEN
                    -- Nothing fits even an empty counter: what a denial
                    -- reports is the latest committed value.
                    v_used := pgquota.usage_used_fresh(p_quota_names[i], p_members[i], v_ws, v_we);
                    v_ok := false;
                    EXIT;
                END IF;
                v_used := 0;
                INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
                VALUES (p_quota_names[i], p_members[i], v_ws, v_we, v_take, v_at)
                ON CONFLICT (quota_name, member, window_start, window_end) DO NOTHING;
                v_ok := FOUND;
                EXIT WHEN v_ok;
                -- Inserted meanwhile by another call: lock it and decide on it.
            END LOOP;
            v_lo := greatest(v_lo, v_ws);
            v_hi := least(v_hi, v_we);
            o_i := o_i || i;
            o_lim := o_lim || v_lim;
            o_ws := o_ws || v_ws;
            o_we := o_we || v_we;
            o_wr := o_wr || v_ok;
            o_bef := o_bef || v_used;
            o_aft := o_aft || (v_used + CASE WHEN v_ok THEN v_take ELSE 0 END);
        END LOOP;
        -- Every lock is held: the decision's instant, if every window holds it.
        v_now := pgquota.clock();
        EXIT WHEN v_now >= v_lo AND v_now < v_hi;
        -- A boundary passed: undo this pass's writes, one counter at a time
        -- (the rows are still held), and decide again.
        FOR i IN 1 .. cardinality(o_i) LOOP
            CONTINUE WHEN NOT o_wr[i];
            UPDATE pgquota.usage u SET used = o_bef[i]
            WHERE u.quota_name = p_quota_names[o_i[i]] AND u.member = p_members[o_i[i]]
              AND u.window_start = o_ws[i] AND u.window_end = o_we[i];
        END LOOP;
        v_at := v_now;
    END LOOP;
    RETURN QUERY
        SELECT x.i, x.lim, x.ws, x.we, x.wr, x.bef, x.aft, v_now
        FROM unnest(o_i, o_lim, o_ws, o_we, o_wr, o_bef, o_aft) AS x(i, lim, ws, we, wr, bef, aft);
END
$fn$;

-- pgquota.lease_wait_register: 00013_lease_waiter.sql (SECURITY DEFINER
-- since 00022). The clock is read once into a variable: Citus refuses
-- pgquota.clock() in the WHERE of a DELETE on a distributed table.
CREATE OR REPLACE FUNCTION pgquota.lease_wait_register(p_name text, p_waiter text, p_for interval)
RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
DECLARE
    v_now   timestamptz;
    v_until timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(pgquota.lease_wait_lock_key(p_name));
    v_now := pgquota.clock();
    DELETE FROM pgquota.lease_waiter w WHERE w.name = p_name AND w.until <= v_now;
    v_until := v_now + p_for;
    INSERT INTO pgquota.lease_waiter AS w (name, waiter, until)
    VALUES (p_name, p_waiter, v_until)
    ON CONFLICT (name, waiter) DO UPDATE SET until = excluded.until;
    RETURN v_until;
END
$fn$;

-- pgquota.fence_proof: 00018_guard_binding.sql. A proof binds a token to
-- the transaction that presented it through its transaction id, which is
-- unique on one server only: each Citus node counts its own, and the key
-- (pgquota.fence_secret) is a reference table, the same on every node. A
-- proof minted on a worker would be valid on the coordinator in the
-- transaction that gets the same id, so no proof is minted on a worker
-- (pgquota runs on the coordinator only); the guard verifies on the
-- coordinator, where guarded tables live (GuardTable refuses distributed
-- and reference tables).
CREATE OR REPLACE FUNCTION pgquota.fence_proof(p_resource text, p_token bigint, p_lease text) RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ021',
            MESSAGE = 'pgquota: present_token on a Citus worker node: pgquota runs on the coordinator only (a token is presented and checked there)';
    END IF;
    RETURN (SELECT encode(sha256(s.secret || sha256(s.secret || convert_to(
               json_build_array(pg_current_xact_id()::text, p_token, p_lease, p_resource)::text, 'UTF8'))), 'hex')
            FROM pgquota.fence_secret s);
END
$fn$;

-- The lease epoch (00007, 00019): pgquota.next_lease_token and the epoch
-- calls behind `pgquota lease epoch bump | prepare | raise` update the
-- reference table pgquota.lease_epoch with clock_timestamp() and
-- pgquota.system_identifier() in the SET, which Citus refuses ("functions
-- used in UPDATE queries on distributed tables must not be VOLATILE"): on
-- Citus the epoch could never be bumped, and after a failover or restore
-- of the coordinator (a new timeline or system identifier), every lease
-- acquisition failed. Their Citus bodies read both into variables first;
-- everything else is the migrations' body.

-- pgquota.next_lease_token: see above.
CREATE OR REPLACE FUNCTION pgquota.next_lease_token()
 RETURNS bigint
 LANGUAGE plpgsql
AS $fn$
DECLARE
    v_citus_at  timestamptz;
    v_citus_sys bigint := pgquota.system_identifier();
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_sys   bigint;
    v_tl    bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    v_sys := pgquota.system_identifier();
    LOOP
        v_tl := pgquota.wal_timeline();
        IF v_tl IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: cannot issue a lease token on a standby (recovery is in progress)';
        END IF;
        SELECT * INTO v_row FROM pgquota.lease_epoch;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
        END IF;
        v_epoch := greatest(pgquota.lease_epoch_for(v_row.epoch, v_row.timeline_offset, v_row.system_identifier, v_sys, v_tl),
                            pgquota.lease_epoch_floor(v_row.pending_epoch, v_row.pending_timeline, v_row.system_identifier, v_sys, v_tl));
        IF v_epoch > 8388607 THEN
            RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
        END IF;
        EXIT WHEN v_row.epoch = v_epoch AND v_row.system_identifier = v_sys AND v_row.timeline_offset = v_epoch - v_tl;
        v_citus_at := clock_timestamp();
        UPDATE pgquota.lease_epoch
        SET system_identifier = v_sys, timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = v_citus_at,
            pending_epoch = CASE WHEN pending_epoch > v_epoch THEN pending_epoch END,
            pending_timeline = CASE WHEN pending_epoch > v_epoch THEN pending_timeline END
        WHERE epoch = v_row.epoch AND system_identifier = v_row.system_identifier AND timeline_offset = v_row.timeline_offset;
    END LOOP;
    RETURN (v_epoch << 40) + nextval('pgquota.lease_token');
END
$fn$;


-- pgquota.lease_epoch_bump: see above.
CREATE OR REPLACE FUNCTION pgquota.lease_epoch_bump(p_min_epoch bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgquota', 'pg_temp'
AS $fn$
DECLARE
    v_citus_at  timestamptz;
    v_citus_sys bigint := pgquota.system_identifier();
    v_epoch bigint;
    v_tl    bigint := pgquota.wal_timeline();
BEGIN
    IF v_tl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: the lease epoch can only be raised on a primary';
    END IF;
    PERFORM pgquota.durable_commit();
    PERFORM 1 FROM pgquota.lease_epoch FOR UPDATE;
    v_epoch := greatest(pgquota.lease_epoch_now() + 1, coalesce(p_min_epoch, 0));
    IF v_epoch > 8388607 THEN
        RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
    END IF;
    v_citus_at := clock_timestamp();
    UPDATE pgquota.lease_epoch
    SET system_identifier = v_citus_sys,
        timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = v_citus_at;
    RETURN v_epoch;
END
$fn$;


-- pgquota.lease_epoch_prepare: see above.
CREATE OR REPLACE FUNCTION pgquota.lease_epoch_prepare(p_min_epoch bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgquota', 'pg_temp'
AS $fn$
DECLARE
    v_citus_at  timestamptz;
    v_citus_sys bigint := pgquota.system_identifier();
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_tl    bigint := pgquota.wal_timeline();
BEGIN
    IF v_tl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: the lease epoch can only be raised on a primary';
    END IF;
    IF p_min_epoch < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('pgquota: minimum epoch must be 0 or more, got %s', p_min_epoch);
    END IF;
    PERFORM set_config('synchronous_commit', 'remote_apply', true);
    SELECT * INTO v_row FROM pgquota.lease_epoch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
    END IF;
    v_epoch := greatest(pgquota.lease_epoch_now() + 1, coalesce(p_min_epoch, 0));
    IF v_epoch > 8388607 THEN
        RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
    END IF;
    v_citus_at := clock_timestamp();
    UPDATE pgquota.lease_epoch
    SET pending_epoch = CASE WHEN pending_timeline = v_tl THEN greatest(pending_epoch, v_epoch) ELSE v_epoch END,
        pending_timeline = v_tl,
        updated_at = v_citus_at;
    RETURN v_epoch;
END
$fn$;


-- pgquota.lease_epoch_raise: see above.
CREATE OR REPLACE FUNCTION pgquota.lease_epoch_raise(p_epoch bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgquota', 'pg_temp'
AS $fn$
DECLARE
    v_citus_at  timestamptz;
    v_citus_sys bigint := pgquota.system_identifier();
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_tl    bigint := pgquota.wal_timeline();
BEGIN
    IF v_tl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: the lease epoch can only be raised on a primary';
    END IF;
    PERFORM pgquota.durable_commit();
    SELECT * INTO v_row FROM pgquota.lease_epoch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
    END IF;
    IF v_row.pending_epoch IS NULL OR v_row.pending_timeline <> v_tl OR v_row.pending_epoch < p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('pgquota: lease epoch %s was not prepared on timeline %s (pgquota.lease_epoch_prepare first)', p_epoch, v_tl);
    END IF;
    v_epoch := greatest(pgquota.lease_epoch_now(), p_epoch);
    v_citus_at := clock_timestamp();
    UPDATE pgquota.lease_epoch
    SET system_identifier = v_citus_sys,
        timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = v_citus_at,
        pending_epoch = CASE WHEN pending_epoch > v_epoch THEN pending_epoch END,
        pending_timeline = CASE WHEN pending_epoch > v_epoch THEN pending_timeline END;
    RETURN v_epoch;
END
$fn$;
