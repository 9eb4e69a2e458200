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
