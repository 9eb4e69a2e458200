-- Batches for every kind of quota: GrantBatch, Config.Coalesce and
-- Config.GroupCommit decide grants of kind rate, fixed and rolling, and
-- grants against several quotas, in one statement per batch too; and the
-- calendar batch reports the instant it decided at.

-- +goose Up

-- pgquota.grant_limits_batch decides a batch of grants, each exactly as
-- one call of pgquota.grant_limits (migrations/00011) would decide it, one
-- after another in array order, in ONE statement (queries/rate_batch.sql,
-- LimitsGrantBatch, runs it). Request i names the quotas
-- p_quota_names[p_firsts[i] .. p_firsts[i] + p_counts[i] - 1] (one for a
-- single quota, up to 16 for a grant against several), for member
-- p_members[i], p_amounts[i] units, with the call's limit p_limits[i] (-1
-- for none: the member's override, else the quota's default).
--
-- It returns the rows pgquota.grant_limits returns for each request (one
-- per quota of the request, ord 1..n), each with req_index = i, requests in
-- array order.
--
-- Why it is exact: it is the loop that calls pgquota.grant_limits for each
-- request in turn, in one transaction. Each call locks its state rows and
-- reads the clock after the locks, as it does alone; a call's rows that an
-- earlier call of the batch locked are held already, so it sees that
-- call's write, and decides at a later instant of pgquota.clock() (or the
-- same one with a pinned clock). So request i gets the outcome it would
-- get had the requests run alone one after another in array order, with
-- its own decided_at.
--
-- Why two batches cannot deadlock: before the first call, every state row
-- the batch's usable requests will lock (a request is usable when each of
-- its quotas exists, has a limit, has its shape row, and a rolling limit
-- of at most 10,000: what pgquota.grant_limits checks before it locks
-- anything) is locked, created first at its initial state when missing,
-- in (quota name, member) order: the order in which pgquota.grant_limits
-- locks the rows of one call, and pgquota.usage_grant_batch the counters of
-- a batch, so lock waits between these statements never form a cycle. The
-- calls then take no lock the batch does not hold, with one exception: a
-- window boundary (calendar or fixed) passed between the locks and a call,
-- which then locks the new window's counter, out of that order. A cycle
-- through it ends in a deadlock error (SQLSTATE 40P01) that rolls the
-- batch back as a whole; pgquota retries it where it owns the transaction.
-- Under REPEATABLE READ or SERIALIZABLE a concurrent change fails the
-- batch with 40001, as for pgquota.grant_limits.
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_limits_batch(
    p_quota_names text[], p_firsts integer[], p_counts integer[],
    p_members text[], p_amounts bigint[], p_limits bigint[]
) RETURNS TABLE (
    req_index integer,
    ord integer, quota_name text, kind text, found boolean, decided boolean,
    limit_value bigint, burst bigint, period_us bigint, fits boolean, granted boolean,
    used bigint, remaining bigint, window_start timestamptz, window_end timestamptz,
    retry_after_us bigint, reset_after_us bigint, decided_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    n       integer := coalesce(cardinality(p_members), 0);
    v_now   timestamptz := pgquota.clock();
    v_start timestamptz;
    v_end   timestamptz;
    i       integer;
    r       record;
BEGIN
    -- Lock the state rows of the usable requests, in (quota, member) order.
    FOR r IN
        WITH req AS (
            SELECT t.i AS l_i, p_members[t.i] AS l_member, nullif(p_limits[t.i], -1) AS l_limit,
                   p_quota_names[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS l_names
            FROM generate_series(1, n) t(i)
        ), el AS (
            SELECT rq.l_i, rq.l_member, x.l_name, q.name IS NOT NULL AS l_found,
                   q.window_unit AS l_unit, q.time_zone AS l_tz,
                   coalesce(rq.l_limit, o.limit_value, q.default_limit) AS l_limit,
                   s.period_us AS l_period, s.origin AS l_origin
            FROM req rq
            CROSS JOIN LATERAL unnest(rq.l_names) AS x(l_name)
            LEFT JOIN pgquota.quota q ON q.name = x.l_name
            LEFT JOIN pgquota.quota_shape s ON s.quota_name = q.name
            LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = rq.l_member
        ), usable AS (
            SELECT e.l_i
            FROM el e
            GROUP BY e.l_i
            HAVING bool_and(e.l_found AND e.l_limit IS NOT NULL
                            AND (e.l_unit NOT IN ('rate', 'fixed', 'rolling') OR e.l_period IS NOT NULL)
                            AND NOT (e.l_unit = 'rolling' AND e.l_limit > 10000))
        )
        SELECT DISTINCT e.l_name, e.l_member, e.l_unit, e.l_tz, e.l_period, e.l_origin
        FROM el e
        JOIN usable u ON u.l_i = e.l_i
        ORDER BY e.l_name, e.l_member
    LOOP
        IF r.l_unit = 'rate' THEN
            INSERT INTO pgquota.rate_state AS s (quota_name, member, tat_us)
            VALUES (r.l_name, r.l_member, 0)
            ON CONFLICT ON CONSTRAINT rate_state_pkey DO NOTHING;
            PERFORM 1 FROM pgquota.rate_state s
            WHERE s.quota_name = r.l_name AND s.member = r.l_member
            FOR UPDATE;
        ELSIF r.l_unit = 'rolling' THEN
            INSERT INTO pgquota.rolling_usage AS s (quota_name, member, stamps, units)
            VALUES (r.l_name, r.l_member, '{}', '{}')
            ON CONFLICT ON CONSTRAINT rolling_usage_pkey DO NOTHING;
            PERFORM 1 FROM pgquota.rolling_usage s
            WHERE s.quota_name = r.l_name AND s.member = r.l_member
            FOR UPDATE;
        ELSE
            -- A counter per window, cut as pgquota.grant_limits cuts it.
            IF r.l_unit = 'fixed' THEN
                v_start := r.l_origin + (floor((extract(epoch FROM v_now) - extract(epoch FROM r.l_origin)) * 1000000 / r.l_period)
                                         * r.l_period) * interval '1 microsecond';
                v_end := v_start + r.l_period * interval '1 microsecond';
            ELSE
                v_start := pgquota.window_start(r.l_unit, r.l_tz, v_now);
                v_end := pgquota.window_end(r.l_unit, r.l_tz, v_now);
            END IF;
            INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used)
            VALUES (r.l_name, r.l_member, v_start, v_end, 0)
            ON CONFLICT ON CONSTRAINT usage_pkey DO NOTHING;
            PERFORM 1 FROM pgquota.usage u
            WHERE u.quota_name = r.l_name AND u.member = r.l_member
              AND u.window_start = v_start AND u.window_end = v_end
            FOR UPDATE;
        END IF;
    END LOOP;

    -- Decide the requests one after another, in array order.
    FOR i IN 1 .. n LOOP
        RETURN QUERY
        SELECT i, g.ord, g.quota_name, g.kind, g.found, g.decided, g.limit_value, g.burst, g.period_us,
               g.fits, g.granted, g.used, g.remaining, g.window_start, g.window_end,
               g.retry_after_us, g.reset_after_us, g.decided_at
        FROM pgquota.grant_limits(p_quota_names[p_firsts[i] : p_firsts[i] + p_counts[i] - 1],
                                  p_members[i], p_amounts[i], nullif(p_limits[i], -1)) g
        ORDER BY g.ord;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- pgquota.usage_grant_batch (migrations/00009) again, with one more column:
-- decided_at, the database clock's instant the batch was decided at (the
-- instant whose window every counter is in), from which a calendar request
-- of a batch gets its RetryAfter and ResetAfter (quota/batch.go). The body
-- is 00009's, unchanged but for that column.
DROP FUNCTION pgquota.usage_grant_batch(text[], text[], integer[], integer[], bigint[], bigint[]);
-- +goose StatementBegin
CREATE FUNCTION pgquota.usage_grant_batch(
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
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_at    timestamptz := pgquota.clock();
    v_todo  integer[] := array(SELECT generate_series(1, coalesce(cardinality(p_quota_names), 0)));
    v_again integer[];
    r       record;
BEGIN
    WHILE cardinality(v_todo) > 0 LOOP
        v_again := '{}';
        FOR r IN
            WITH grp AS (
                SELECT t.i,
                       p_quota_names[t.i] AS quota_name,
                       p_members[t.i] AS member,
                       p_amounts[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS amounts,
                       p_limits[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS limits
                FROM unnest(v_todo) AS t(i)
            ), gdef AS MATERIALIZED (
                SELECT g.i, g.quota_name, g.member, g.amounts, g.limits,
                       coalesce(o.limit_value, q.default_limit) AS implicit_limit,
                       pgquota.window_start(q.window_unit, q.time_zone, v_at) AS window_start,
                       pgquota.window_end(q.window_unit, q.time_zone, v_at) AS window_end
                FROM grp g
                JOIN pgquota.quota q ON q.name = g.quota_name
                LEFT JOIN pgquota.quota_override o ON o.quota_name = g.quota_name AND o.member = g.member
            ), snap AS MATERIALIZED (
                -- The counters in this statement's snapshot: which exist,
                -- and what a denial reports. Never a guard.
                SELECT g.i, u.used
                FROM gdef g
                JOIN pgquota.usage u ON u.quota_name = g.quota_name
                                    AND u.member = g.member
                                    AND u.window_start = g.window_start
                                    AND u.window_end = g.window_end
            ), cur AS (
                SELECT g.i, u.quota_name, u.member, u.window_start, u.window_end, u.used,
                       g.amounts, g.limits, g.implicit_limit
                FROM gdef g
                JOIN pgquota.usage u ON u.quota_name = g.quota_name
                                    AND u.member = g.member
                                    AND u.window_start = g.window_start
                                    AND u.window_end = g.window_end
                WHERE pgquota.greedy_take(u.used, g.amounts, g.limits, g.implicit_limit) > 0
                ORDER BY u.quota_name, u.member, u.window_start, u.window_end
                FOR NO KEY UPDATE OF u
            ), upd AS (
                UPDATE pgquota.usage u
                SET used = u.used + pgquota.greedy_take(u.used, c.amounts, c.limits, c.implicit_limit),
                    updated_at = v_at
                FROM cur c
                WHERE u.quota_name = c.quota_name
                  AND u.member = c.member
                  AND u.window_start = c.window_start
                  AND u.window_end = c.window_end
                RETURNING c.i, c.used AS used_before, u.used AS used_after
            ), ins AS (
                INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
                SELECT g.quota_name, g.member, g.window_start, g.window_end,
                       pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit), v_at
                FROM gdef g
                WHERE pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0
                  AND NOT EXISTS (SELECT 1 FROM snap s WHERE s.i = g.i)
                ORDER BY g.quota_name, g.member
                ON CONFLICT (quota_name, member, window_start, window_end) DO NOTHING
                RETURNING u.quota_name, u.member, u.used
            )
            SELECT g.i, g.implicit_limit, g.window_start, g.window_end,
                   upd.used_before AS upd_before, upd.used_after AS upd_after,
                   ins.used AS ins_used,
                   (upd.i IS NULL AND ins.used IS NULL AND s.i IS NULL
                    AND pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0) AS again,
                   (CASE WHEN upd.i IS NULL AND ins.used IS NULL
                         THEN pgquota.usage_used_fresh(g.quota_name, g.member, g.window_start, g.window_end)
                    END) AS fresh_used
            FROM gdef g
            LEFT JOIN snap s ON s.i = g.i
            LEFT JOIN upd ON upd.i = g.i
            LEFT JOIN ins ON ins.quota_name = g.quota_name AND ins.member = g.member
        LOOP
            IF r.again THEN
                v_again := v_again || r.i;
                CONTINUE;
            END IF;
            counter_index := r.i;
            implicit_limit := r.implicit_limit;
            window_start := r.window_start;
            window_end := r.window_end;
            written := r.upd_before IS NOT NULL OR r.ins_used IS NOT NULL;
            used_before := coalesce(r.upd_before, CASE WHEN r.ins_used IS NOT NULL THEN 0 END, r.fresh_used);
            used_after := coalesce(r.upd_after, r.ins_used, r.fresh_used);
            decided_at := v_at;
            RETURN NEXT;
        END LOOP;
        v_todo := v_again;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- The application role gets the functions (see 00011).
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regrole('pgquota_app') IS NOT NULL THEN
        PERFORM pgquota.grant_app('pgquota_app');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.grant_limits_batch(text[], integer[], integer[], text[], bigint[], bigint[]);
DROP FUNCTION pgquota.usage_grant_batch(text[], text[], integer[], integer[], bigint[], bigint[]);
-- +goose StatementBegin
CREATE FUNCTION pgquota.usage_grant_batch(
    p_quota_names text[], p_members text[], p_firsts integer[], p_counts integer[],
    p_amounts bigint[], p_limits bigint[]
) RETURNS TABLE (
    counter_index      integer,
    implicit_limit     bigint,
    window_start       timestamptz,
    window_end         timestamptz,
    written            boolean,
    used_before        bigint,
    used_after         bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_at    timestamptz := pgquota.clock();
    v_todo  integer[] := array(SELECT generate_series(1, coalesce(cardinality(p_quota_names), 0)));
    v_again integer[];
    r       record;
BEGIN
    WHILE cardinality(v_todo) > 0 LOOP
        v_again := '{}';
        FOR r IN
            WITH grp AS (
                SELECT t.i,
                       p_quota_names[t.i] AS quota_name,
                       p_members[t.i] AS member,
                       p_amounts[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS amounts,
                       p_limits[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS limits
                FROM unnest(v_todo) AS t(i)
            ), gdef AS MATERIALIZED (
                SELECT g.i, g.quota_name, g.member, g.amounts, g.limits,
                       coalesce(o.limit_value, q.default_limit) AS implicit_limit,
                       pgquota.window_start(q.window_unit, q.time_zone, v_at) AS window_start,
                       pgquota.window_end(q.window_unit, q.time_zone, v_at) AS window_end
                FROM grp g
                JOIN pgquota.quota q ON q.name = g.quota_name
                LEFT JOIN pgquota.quota_override o ON o.quota_name = g.quota_name AND o.member = g.member
            ), snap AS MATERIALIZED (
                -- The counters in this statement's snapshot: which exist,
                -- and what a denial reports. Never a guard.
                SELECT g.i, u.used
                FROM gdef g
                JOIN pgquota.usage u ON u.quota_name = g.quota_name
                                    AND u.member = g.member
                                    AND u.window_start = g.window_start
                                    AND u.window_end = g.window_end
            ), cur AS (
                SELECT g.i, u.quota_name, u.member, u.window_start, u.window_end, u.used,
                       g.amounts, g.limits, g.implicit_limit
                FROM gdef g
                JOIN pgquota.usage u ON u.quota_name = g.quota_name
                                    AND u.member = g.member
                                    AND u.window_start = g.window_start
                                    AND u.window_end = g.window_end
                WHERE pgquota.greedy_take(u.used, g.amounts, g.limits, g.implicit_limit) > 0
                ORDER BY u.quota_name, u.member, u.window_start, u.window_end
                FOR NO KEY UPDATE OF u
            ), upd AS (
                UPDATE pgquota.usage u
                SET used = u.used + pgquota.greedy_take(u.used, c.amounts, c.limits, c.implicit_limit),
                    updated_at = v_at
                FROM cur c
                WHERE u.quota_name = c.quota_name
                  AND u.member = c.member
                  AND u.window_start = c.window_start
                  AND u.window_end = c.window_end
                RETURNING c.i, c.used AS used_before, u.used AS used_after
            ), ins AS (
                INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
                SELECT g.quota_name, g.member, g.window_start, g.window_end,
                       pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit), v_at
                FROM gdef g
                WHERE pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0
                  AND NOT EXISTS (SELECT 1 FROM snap s WHERE s.i = g.i)
                ORDER BY g.quota_name, g.member
                ON CONFLICT (quota_name, member, window_start, window_end) DO NOTHING
                RETURNING u.quota_name, u.member, u.used
            )
            SELECT g.i, g.implicit_limit, g.window_start, g.window_end,
                   upd.used_before AS upd_before, upd.used_after AS upd_after,
                   ins.used AS ins_used,
                   (upd.i IS NULL AND ins.used IS NULL AND s.i IS NULL
                    AND pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0) AS again,
                   (CASE WHEN upd.i IS NULL AND ins.used IS NULL
                         THEN pgquota.usage_used_fresh(g.quota_name, g.member, g.window_start, g.window_end)
                    END) AS fresh_used
            FROM gdef g
            LEFT JOIN snap s ON s.i = g.i
            LEFT JOIN upd ON upd.i = g.i
            LEFT JOIN ins ON ins.quota_name = g.quota_name AND ins.member = g.member
        LOOP
            IF r.again THEN
                v_again := v_again || r.i;
                CONTINUE;
            END IF;
            counter_index := r.i;
            implicit_limit := r.implicit_limit;
            window_start := r.window_start;
            window_end := r.window_end;
            written := r.upd_before IS NOT NULL OR r.ins_used IS NOT NULL;
            used_before := coalesce(r.upd_before, CASE WHEN r.ins_used IS NOT NULL THEN 0 END, r.fresh_used);
            used_after := coalesce(r.upd_after, r.ins_used, r.fresh_used);
            RETURN NEXT;
        END LOOP;
        v_todo := v_again;
    END LOOP;
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

