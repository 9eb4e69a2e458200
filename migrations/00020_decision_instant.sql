-- Decision instants at the edges: every grant decided by
-- pgquota.grant_limits (00011; through pgquota.grant, grant_limits_batch
-- (00016), GrantBatch, Config.Coalesce and Config.GroupCommit) is decided at
-- an instant its windows hold, in a lock order that does not depend on the
-- window, and a rate's refill instants are exact.
--
-- 1. The decision's instant. grant_limits cut the windows from one reading
--    of pgquota.clock() and then read the clock again to decide, so a
--    boundary passing between the two decided a grant in one window and
--    counted it in the previous one (decided_at >= window_end, a negative
--    retry_after_us: RetryAfter = Never; a window holding more than its
--    limit by decision time). Now the instant the windows were last
--    checked against, read after every lock is held, is the decision's
--    instant: window_start <= decided_at < window_end for every counter.
--
-- 2. The lock order. grant_limits locked its state rows in quota-name
--    order, but when a boundary passed during a lock wait it locked the new
--    window's counter after the rows of later-named quotas: two calls could
--    wait on each other (SQLSTATE 40P01 at READ COMMITTED, from SQL
--    callers; 00011's header said this could not happen, and 00016's that
--    it ended in 40P01). Now every call takes its locks in one order:
--      a. the rows of each (quota, member) that no window names, in
--         quota-name order: a rate's pgquota.rate_state row, a rolling
--         window's pgquota.rolling_usage row and, for a calendar or fixed
--         quota of a call naming several (quota, member) pairs (a grant
--         against several quotas, a batch), its pgquota.counter_lock row;
--      b. then the counters of the windows holding the clock's instant, in
--         quota-name order; when a boundary passed meanwhile, the new
--         window's counter.
--    A counter locked out of name order in b is one whose counter_lock row
--    the call holds. Whoever holds that counter holds no counter_lock row
--    of the quota: it is a call on that one (quota, member) (grant_limits
--    of one quota, pgquota.grant's conditional update, a revoke), which
--    locks nothing else of this call's and moves to later windows only, so
--    it never waits for this call, and no cycle of lock waits forms. Go's
--    calendar batch statement pgquota.usage_grant_batch (not part of the
--    SQL interface) takes its locks in this order too (see below); before,
--    it locked several calendar counters without counter_lock rows, and at
--    a boundary of one of two calendar quotas of different window lengths
--    it could end in 40P01 against a grant naming both.
--
-- 3. Refill instants. A rate's emission interval period/limit was a
--    rounded numeric (1/6 s = 166666.6666666666666667 us): six of them
--    made a TAT 2e-16 us past the refill instant, so an exact refill
--    instant was denied with retry_after_us 1 while remaining said the
--    units were there. Now GCRA is computed exactly in units of 1/limit
--    microsecond, where the emission interval is the period (an integer),
--    every instant an integer, and floors and ceilings are integer
--    divisions (pgquota.floor_div, pgquota.ceil_div). rate_state.tat_us
--    stays in microseconds, to 30 decimal places: TAT * limit rounds back
--    to the exact integer for every limit up to 2^62 - 1. A TAT stored
--    before this migration, or under another limit, is rounded to the
--    nearest 1/limit microsecond (less than half of it). Fixed windows are
--    cut by integer division too (a 100-year window's last microsecond
--    rounded to the next window).

-- +goose Up

-- pgquota.floor_div and pgquota.ceil_div: floor(a / b) and ceil(a / b) of
-- whole numbers, b > 0, exactly (div and mod are exact; numeric's / rounds
-- to a scale, which can carry a quotient across a whole number).
-- +goose StatementBegin
CREATE FUNCTION pgquota.floor_div(a numeric, b numeric) RETURNS numeric
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT div(a, b) - CASE WHEN a < 0 AND mod(a, b) <> 0 THEN 1 ELSE 0 END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION pgquota.ceil_div(a numeric, b numeric) RETURNS numeric
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT div(a, b) + CASE WHEN a > 0 AND mod(a, b) <> 0 THEN 1 ELSE 0 END $$;
-- +goose StatementEnd

-- pgquota.counter_lock: one row per (quota, member) of a calendar or fixed
-- quota that a grant naming several (quota, member) pairs has locked (see
-- 2. above); no data, only the lock. A rate's and a rolling window's state
-- rows serve as their own.
CREATE TABLE pgquota.counter_lock (
    quota_name text NOT NULL REFERENCES pgquota.quota (name) ON DELETE CASCADE,
    member     text NOT NULL,
    CONSTRAINT counter_lock_pkey PRIMARY KEY (quota_name, member),
    CONSTRAINT counter_lock_member_length CHECK (octet_length(member) BETWEEN 1 AND 255)
);

-- pgquota.grant_limits (00011): the rows and their meaning are 00011's.
-- Why it is exact: every state row the call reads is locked first (FOR
-- UPDATE, in the order of 2. above, so two calls never wait on each other
-- in a cycle); a missing row is inserted first at its initial state (zero
-- units, an old TAT, no stamps) with ON CONFLICT DO NOTHING, and locked by
-- the next statement, which in READ COMMITTED takes a new snapshot and so
-- sees a row a concurrent call created meanwhile. Every decision is taken
-- on the locked rows, at an instant of the clock read after the last lock
-- was taken and held by every counter's window: a call that waited for
-- another sees its write and a later instant, so the instants recorded on
-- one member's state only move forward. Nothing is written unless every
-- quota fits. Under REPEATABLE READ or SERIALIZABLE a concurrent change
-- fails the call with SQLSTATE 40001 (retried where pgquota owns the
-- transaction).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_limits(p_quotas text[], p_member text, p_amount bigint, p_limit bigint)
RETURNS TABLE (
    ord integer, quota_name text, kind text, found boolean, decided boolean,
    limit_value bigint, burst bigint, period_us bigint, fits boolean, granted boolean,
    used bigint, remaining bigint, window_start timestamptz, window_end timestamptz,
    retry_after_us bigint, reset_after_us bigint, decided_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_variable
DECLARE
    n        integer := coalesce(cardinality(p_quotas), 0);
    k_kind   text[] := '{}';
    k_tz     text[] := '{}';
    k_found  boolean[] := '{}';
    k_limit  bigint[] := '{}';
    k_burst  bigint[] := '{}';
    k_period bigint[] := '{}';
    k_origin timestamptz[] := '{}';
    k_wstart timestamptz[] := '{}';
    k_wend   timestamptz[] := '{}';
    k_fits   boolean[] := '{}';
    k_used   bigint[] := '{}';
    k_rem    bigint[] := '{}';
    k_retry  bigint[] := '{}';
    k_reset  bigint[] := '{}';
    k_tat    numeric[] := '{}';  -- a rate's TAT in units of 1/limit microsecond (an integer)
    k_stamps text[] := '{}';   -- the kept rolling entries, as text arrays (written back on a grant)
    k_units  text[] := '{}';
    v_order  integer[];
    v_ok     boolean := true;
    v_all    boolean := true;
    v_now    timestamptz;
    v_now_s  numeric;
    v_stable boolean;
    i        integer;
    j        integer;
    r        record;
    v_start  timestamptz;
    v_end    timestamptz;
    v_used   bigint;
    v_p      numeric;
    v_l      numeric;
    v_b      numeric;
    v_tat    numeric;
    v_new    numeric;
    v_diff   numeric;
    v_st     timestamptz[];
    v_un     bigint[];
    v_keep_st timestamptz[];
    v_keep_un bigint[];
    v_cur    bigint;
    v_drop   bigint;
BEGIN
    -- The arguments: a bad one raises 22023 naming it, before anything is
    -- read (Go's callers check them first; this guards the SQL interface).
    IF n = 0 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_quotas must name at least one quota' USING ERRCODE = '22023';
    ELSIF p_member IS NULL OR octet_length(p_member) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_member must be 1 to 255 bytes, got %',
            coalesce(octet_length(p_member) || ' bytes', 'NULL') USING ERRCODE = '22023';
    ELSIF p_member ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_member must not contain control characters' USING ERRCODE = '22023';
    ELSIF p_amount IS NULL OR p_amount < 1 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_amount must be at least 1, got %', coalesce(p_amount::text, 'NULL')
            USING ERRCODE = '22023';
    ELSIF p_limit < 0 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_limit must be at least 0 (or NULL), got %', p_limit USING ERRCODE = '22023';
    END IF;
    -- Definitions and limits: nothing is locked or written unless all are
    -- usable.
    FOR i IN 1 .. n LOOP
        SELECT q.window_unit, q.time_zone,
               coalesce(p_limit, o.limit_value, q.default_limit) AS lim,
               s.period_us AS per, s.burst AS bur, s.origin AS ori
        INTO r
        FROM pgquota.quota q
        LEFT JOIN pgquota.quota_shape s ON s.quota_name = q.name
        LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = p_member
        WHERE q.name = p_quotas[i];
        IF NOT FOUND THEN
            k_found[i] := false; v_ok := false;
            CONTINUE;
        END IF;
        k_found[i] := true;
        k_kind[i] := r.window_unit;
        k_tz[i] := r.time_zone;
        k_limit[i] := r.lim;
        k_period[i] := r.per;
        k_origin[i] := r.ori;
        k_burst[i] := CASE WHEN r.window_unit = 'rate' THEN coalesce(r.bur, r.lim) END;
        IF r.lim IS NULL
           OR (r.window_unit IN ('rate', 'fixed', 'rolling') AND r.per IS NULL)
           OR (r.window_unit = 'rolling' AND r.lim > 10000) THEN
            v_ok := false;
        END IF;
    END LOOP;
    IF NOT v_ok THEN
        RETURN QUERY SELECT g.i, p_quotas[g.i], k_kind[g.i], k_found[g.i], false, k_limit[g.i], k_burst[g.i], k_period[g.i],
                            false, false, 0::bigint, 0::bigint, NULL::timestamptz, NULL::timestamptz,
                            0::bigint, 0::bigint, NULL::timestamptz
                     FROM generate_series(1, n) g(i);
        RETURN;
    END IF;

    SELECT array_agg(g.i ORDER BY p_quotas[g.i], g.i) INTO v_order FROM generate_series(1, n) g(i);

    -- First the rows of each (quota, member) that no window names, in
    -- quota-name order: a rate's or a rolling window's state row, and, in a
    -- call of several quotas, a counter quota's pgquota.counter_lock row
    -- (missing rows are created first at their initial state).
    FOREACH i IN ARRAY v_order LOOP
        IF k_kind[i] = 'rate' THEN
            INSERT INTO pgquota.rate_state AS s (quota_name, member, tat_us)
            VALUES (p_quotas[i], p_member, 0)
            ON CONFLICT ON CONSTRAINT rate_state_pkey DO NOTHING;
            SELECT s.tat_us INTO v_tat FROM pgquota.rate_state s
            WHERE s.quota_name = p_quotas[i] AND s.member = p_member
            FOR UPDATE;
            -- In units of 1/limit us: an integer (stored in us to 30 places).
            k_tat[i] := round(v_tat * greatest(k_limit[i], 1));
        ELSIF k_kind[i] = 'rolling' THEN
            INSERT INTO pgquota.rolling_usage AS s (quota_name, member, stamps, units)
            VALUES (p_quotas[i], p_member, '{}', '{}')
            ON CONFLICT ON CONSTRAINT rolling_usage_pkey DO NOTHING;
            SELECT s.stamps, s.units INTO v_st, v_un FROM pgquota.rolling_usage s
            WHERE s.quota_name = p_quotas[i] AND s.member = p_member
            FOR UPDATE;
            k_stamps[i] := v_st::text;
            k_units[i] := v_un::text;
        ELSIF n > 1 THEN
            INSERT INTO pgquota.counter_lock AS c (quota_name, member)
            VALUES (p_quotas[i], p_member)
            ON CONFLICT ON CONSTRAINT counter_lock_pkey DO NOTHING;
            PERFORM 1 FROM pgquota.counter_lock c
            WHERE c.quota_name = p_quotas[i] AND c.member = p_member
            FOR UPDATE;
        END IF;
    END LOOP;

    -- Then the counters (calendar and fixed windows), in quota-name order,
    -- of the windows holding the clock's instant. The instant is read after
    -- every lock is held and the windows are derived again from it; when a
    -- window changed (a boundary passed during a lock wait), that window's
    -- counter is locked too and the clock read again. The instant the
    -- windows were last checked against is the decision's instant: every
    -- window holds it.
    v_now := pgquota.clock();
    LOOP
        v_stable := true;
        FOREACH i IN ARRAY v_order LOOP
            CONTINUE WHEN k_kind[i] NOT IN ('none', 'hour', 'day', 'week', 'month', 'fixed');
            IF k_kind[i] = 'fixed' THEN
                v_start := k_origin[i] + (pgquota.floor_div((extract(epoch FROM v_now) - extract(epoch FROM k_origin[i])) * 1000000, k_period[i])
                                          * k_period[i]) * interval '1 microsecond';
                v_end := v_start + k_period[i] * interval '1 microsecond';
            ELSE
                v_start := pgquota.window_start(k_kind[i], k_tz[i], v_now);
                v_end := pgquota.window_end(k_kind[i], k_tz[i], v_now);
            END IF;
            IF k_wstart[i] IS NOT DISTINCT FROM v_start AND k_wend[i] IS NOT DISTINCT FROM v_end THEN
                CONTINUE;
            END IF;
            v_stable := false;
            k_wstart[i] := v_start;
            k_wend[i] := v_end;
            INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used)
            VALUES (p_quotas[i], p_member, v_start, v_end, 0)
            ON CONFLICT ON CONSTRAINT usage_pkey DO NOTHING;
            SELECT u.used INTO v_used FROM pgquota.usage u
            WHERE u.quota_name = p_quotas[i] AND u.member = p_member
              AND u.window_start = v_start AND u.window_end = v_end
            FOR UPDATE;
            k_used[i] := v_used;
        END LOOP;
        EXIT WHEN v_stable;
        v_now := pgquota.clock();
    END LOOP;
    v_now_s := extract(epoch FROM v_now) * 1000000;  -- whole microseconds

    -- Decide every quota on its locked row, at v_now.
    FOR i IN 1 .. n LOOP
        IF k_kind[i] = 'rate' THEN
            v_p := k_period[i];
            v_l := k_limit[i];
            v_b := k_burst[i];
            IF k_limit[i] = 0 OR p_amount > k_burst[i] THEN
                -- limit 0 grants nothing; an amount above the burst never fits.
                k_fits[i] := false;
                k_retry[i] := -1;
                IF k_limit[i] = 0 THEN
                    k_rem[i] := 0;
                    k_reset[i] := -1;
                ELSE
                    v_tat := greatest(k_tat[i], v_now_s * v_l);
                    k_rem[i] := least(v_b, greatest(0, pgquota.floor_div(v_now_s * v_l - (v_tat - v_b * v_p), v_p)))::bigint;
                    k_reset[i] := least(pgquota.ceil_div(v_tat - v_now_s * v_l, v_l), 9223372036854775807)::bigint;
                END IF;
            ELSE
                -- GCRA (the ATM Forum's generic cell rate algorithm, in the
                -- form of go-redis/redis_rate): emission interval T =
                -- period/limit, tolerance burst*T; computed exactly in
                -- units of 1/limit microsecond, where T is the period (an
                -- integer) and every instant an integer, floors and
                -- ceilings by integer division.
                v_tat := greatest(k_tat[i], v_now_s * v_l);
                v_new := v_tat + p_amount * v_p;
                v_diff := v_now_s * v_l - (v_new - v_b * v_p);
                IF v_diff >= 0 THEN
                    k_fits[i] := true;
                    k_tat[i] := v_new;
                    k_retry[i] := 0;
                    k_rem[i] := least(v_b, pgquota.floor_div(v_diff, v_p))::bigint;
                    k_reset[i] := least(pgquota.ceil_div(v_new - v_now_s * v_l, v_l), 9223372036854775807)::bigint;
                ELSE
                    k_fits[i] := false;
                    k_retry[i] := least(pgquota.ceil_div(-v_diff, v_l), 9223372036854775807)::bigint;
                    k_rem[i] := least(v_b, greatest(0, pgquota.floor_div(v_now_s * v_l - (v_tat - v_b * v_p), v_p)))::bigint;
                    k_reset[i] := least(pgquota.ceil_div(v_tat - v_now_s * v_l, v_l), 9223372036854775807)::bigint;
                END IF;
            END IF;
            k_used[i] := k_burst[i] - k_rem[i];
        ELSIF k_kind[i] = 'rolling' THEN
            -- Keep the grants of the last period: stamps newer than now - W.
            v_st := k_stamps[i]::timestamptz[];
            v_un := k_units[i]::bigint[];
            v_keep_st := '{}';
            v_keep_un := '{}';
            v_cur := 0;
            FOR j IN 1 .. coalesce(cardinality(v_st), 0) LOOP
                IF v_st[j] > v_now - k_period[i] * interval '1 microsecond' THEN
                    v_keep_st := v_keep_st || v_st[j];
                    v_keep_un := v_keep_un || v_un[j];
                    v_cur := v_cur + v_un[j];
                END IF;
            END LOOP;
            IF v_cur + p_amount <= k_limit[i] THEN
                k_fits[i] := true;
                k_retry[i] := 0;
                v_keep_st := v_keep_st || v_now;
                v_keep_un := v_keep_un || p_amount;
                v_cur := v_cur + p_amount;
            ELSE
                k_fits[i] := false;
                IF p_amount > k_limit[i] THEN
                    k_retry[i] := -1;
                ELSE
                    -- The earliest instant at which enough of the oldest
                    -- grants have left the window: when the oldest entry k
                    -- whose removal makes room leaves (stamp + W).
                    v_drop := 0;
                    FOR j IN 1 .. cardinality(v_keep_st) LOOP
                        v_drop := v_drop + v_keep_un[j];
                        IF v_cur - v_drop + p_amount <= k_limit[i] THEN
                            k_retry[i] := ceil(extract(epoch FROM (v_keep_st[j] - v_now)) * 1000000 + k_period[i])::bigint;
                            EXIT;
                        END IF;
                    END LOOP;
                END IF;
            END IF;
            k_stamps[i] := v_keep_st::text;
            k_units[i] := v_keep_un::text;
            k_used[i] := v_cur;
            k_rem[i] := greatest(k_limit[i] - v_cur, 0);
            k_reset[i] := CASE WHEN cardinality(v_keep_st) = 0 THEN 0
                               ELSE greatest(ceil(extract(epoch FROM (v_keep_st[cardinality(v_keep_st)] - v_now)) * 1000000 + k_period[i]), 0)::bigint END;
        ELSE
            -- A counter per window (calendar or fixed), whose window holds v_now.
            k_fits[i] := k_used[i] + p_amount <= k_limit[i];
            IF k_fits[i] THEN
                k_used[i] := k_used[i] + p_amount;
                k_retry[i] := 0;
            ELSIF p_amount > k_limit[i] OR k_kind[i] = 'none' THEN
                k_retry[i] := -1;
            ELSE
                k_retry[i] := ceil(extract(epoch FROM (k_wend[i] - v_now)) * 1000000)::bigint;
            END IF;
            k_rem[i] := greatest(k_limit[i] - k_used[i], 0);
            k_reset[i] := CASE WHEN k_kind[i] = 'none' THEN -1
                               ELSE ceil(extract(epoch FROM (k_wend[i] - v_now)) * 1000000)::bigint END;
        END IF;
        v_all := v_all AND k_fits[i];
    END LOOP;

    IF v_all THEN
        PERFORM pgquota.durable_commit();
        FOR i IN 1 .. n LOOP
            IF k_kind[i] = 'rate' THEN
                UPDATE pgquota.rate_state s SET tat_us = trim_scale(round(k_tat[i], 30) / k_limit[i]), updated_at = v_now
                WHERE s.quota_name = p_quotas[i] AND s.member = p_member;
            ELSIF k_kind[i] = 'rolling' THEN
                UPDATE pgquota.rolling_usage s
                SET stamps = k_stamps[i]::timestamptz[], units = k_units[i]::bigint[], updated_at = v_now
                WHERE s.quota_name = p_quotas[i] AND s.member = p_member;
            ELSE
                UPDATE pgquota.usage u SET used = k_used[i], updated_at = v_now
                WHERE u.quota_name = p_quotas[i] AND u.member = p_member
                  AND u.window_start = k_wstart[i] AND u.window_end = k_wend[i];
            END IF;
        END LOOP;
    ELSE
        -- Nothing moves: report the states as they were, for the quotas
        -- that had room too.
        FOR i IN 1 .. n LOOP
            CONTINUE WHEN NOT k_fits[i];
            IF k_kind[i] = 'rate' THEN
                k_rem[i] := least(k_burst[i], k_rem[i] + p_amount);
                k_used[i] := k_burst[i] - k_rem[i];
                k_reset[i] := least(pgquota.ceil_div(greatest(k_tat[i] - p_amount * k_period[i]::numeric - v_now_s * k_limit[i], 0),
                                                      k_limit[i]), 9223372036854775807)::bigint;
            ELSIF k_kind[i] = 'rolling' THEN
                v_st := k_stamps[i]::timestamptz[];
                k_used[i] := k_used[i] - p_amount;
                k_rem[i] := greatest(k_limit[i] - k_used[i], 0);
                k_reset[i] := CASE WHEN cardinality(v_st) <= 1 THEN 0
                                   ELSE greatest(ceil(extract(epoch FROM (v_st[cardinality(v_st) - 1] - v_now)) * 1000000 + k_period[i]), 0)::bigint END;
            ELSE
                k_used[i] := k_used[i] - p_amount;
                k_rem[i] := greatest(k_limit[i] - k_used[i], 0);
            END IF;
        END LOOP;
    END IF;

    RETURN QUERY SELECT g.i, p_quotas[g.i], k_kind[g.i], true, true, k_limit[g.i], k_burst[g.i], k_period[g.i],
                        k_fits[g.i], v_all, k_used[g.i], k_rem[g.i],
                        CASE WHEN k_kind[g.i] IN ('rate', 'rolling') OR k_kind[g.i] = 'none' THEN NULL ELSE k_wstart[g.i] END,
                        CASE WHEN k_kind[g.i] IN ('rate', 'rolling') OR k_kind[g.i] = 'none' THEN NULL ELSE k_wend[g.i] END,
                        k_retry[g.i], k_reset[g.i], v_now
                 FROM generate_series(1, n) g(i);
END
$$;
-- +goose StatementEnd

-- pgquota.grant_limits_batch (00016): the rows and their meaning are
-- 00016's. Before the first call, every state row the batch's usable
-- requests will lock is locked, created first at its initial state when
-- missing, in the order of 2. above over the batch's (quota, member)
-- pairs; the calls then take no lock out of that order but the counter of
-- a window a boundary opened meanwhile, whose counter_lock row the batch
-- holds when it names several pairs (and which is the only row it holds
-- when it names one).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_limits_batch(
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
    v_now   timestamptz;
    v_start timestamptz;
    v_end   timestamptz;
    v_pass  integer;
    i       integer;
    r       record;
BEGIN
    -- Lock the state rows of the usable requests, in (quota, member) order:
    -- first (pass 1) the rows no window names (rate and rolling state
    -- rows; a counter quota's pgquota.counter_lock row when the batch names
    -- more than one (quota, member)), then (pass 2) the counters of the
    -- windows holding the clock's instant.
    FOR v_pass IN 1 .. 2 LOOP
        v_now := pgquota.clock();
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
            ), keys AS (
                SELECT DISTINCT e.l_name, e.l_member, e.l_unit, e.l_tz, e.l_period, e.l_origin
                FROM el e
                JOIN usable u ON u.l_i = e.l_i
            )
            SELECT k.*, count(*) OVER () AS l_keys
            FROM keys k
            ORDER BY k.l_name, k.l_member
        LOOP
            IF r.l_unit = 'rate' THEN
                CONTINUE WHEN v_pass = 2;
                INSERT INTO pgquota.rate_state AS s (quota_name, member, tat_us)
                VALUES (r.l_name, r.l_member, 0)
                ON CONFLICT ON CONSTRAINT rate_state_pkey DO NOTHING;
                PERFORM 1 FROM pgquota.rate_state s
                WHERE s.quota_name = r.l_name AND s.member = r.l_member
                FOR UPDATE;
            ELSIF r.l_unit = 'rolling' THEN
                CONTINUE WHEN v_pass = 2;
                INSERT INTO pgquota.rolling_usage AS s (quota_name, member, stamps, units)
                VALUES (r.l_name, r.l_member, '{}', '{}')
                ON CONFLICT ON CONSTRAINT rolling_usage_pkey DO NOTHING;
                PERFORM 1 FROM pgquota.rolling_usage s
                WHERE s.quota_name = r.l_name AND s.member = r.l_member
                FOR UPDATE;
            ELSIF v_pass = 1 THEN
                CONTINUE WHEN r.l_keys = 1;
                INSERT INTO pgquota.counter_lock AS c (quota_name, member)
                VALUES (r.l_name, r.l_member)
                ON CONFLICT ON CONSTRAINT counter_lock_pkey DO NOTHING;
                PERFORM 1 FROM pgquota.counter_lock c
                WHERE c.quota_name = r.l_name AND c.member = r.l_member
                FOR UPDATE;
            ELSE
                -- A counter per window, cut as pgquota.grant_limits cuts it.
                IF r.l_unit = 'fixed' THEN
                    v_start := r.l_origin + (pgquota.floor_div((extract(epoch FROM v_now) - extract(epoch FROM r.l_origin)) * 1000000, r.l_period)
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

-- pgquota.usage_grant_batch (00016), Go's calendar batch statement: the
-- rows and their meaning are 00016's, and it takes its locks in the order
-- of 2. above too. A batch of several counters first locks each one's
-- pgquota.counter_lock row, in (quota, member) order (one statement when
-- they all exist; else one at a time, each created first); a batch of one
-- counter takes none (it holds one row at a time, as a call on one
-- (quota, member) does). The counters are then locked and decided as in
-- 00016, at the windows of one clock reading; the clock is read again once
-- every lock is held, and when a boundary passed meanwhile (a window no
-- longer holds the new instant) the batch's writes are undone on the rows
-- it still holds and it is decided again at the new instant, in the new
-- windows. decided_at is the last reading: every counter's window holds it.
-- Before, the clock was read once before any lock wait: a batch naming two
-- calendar quotas of different window lengths could end in 40P01 against
-- a grant naming both at a boundary, and decided (and reported) at an
-- instant earlier than the grants it had waited for.
-- +goose StatementBegin
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
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_n     integer := coalesce(cardinality(p_quota_names), 0);
    v_at    timestamptz;
    v_now   timestamptz;
    v_lo    timestamptz;  -- the latest window start of the pass
    v_hi    timestamptz;  -- the earliest window end of the pass
    v_todo  integer[];
    v_again integer[];
    v_keys  integer;
    v_have  integer;
    o_i     integer[];
    o_lim   bigint[];
    o_ws    timestamptz[];
    o_we    timestamptz[];
    o_wr    boolean[];
    o_bef   bigint[];
    o_aft   bigint[];
    w_q     text[];       -- the counters the pass wrote, and their values before
    w_m     text[];
    w_ws    timestamptz[];
    w_we    timestamptz[];
    w_bef   bigint[];
    r       record;
BEGIN
    IF v_n > 1 THEN
        -- The counter_lock rows, in (quota, member) order.
        SELECT count(*), count(c.quota_name) INTO v_keys, v_have
        FROM (SELECT DISTINCT t.q, t.m FROM unnest(p_quota_names, p_members) t(q, m)
              JOIN pgquota.quota qq ON qq.name = t.q) k
        LEFT JOIN pgquota.counter_lock c ON c.quota_name = k.q AND c.member = k.m;
        IF v_keys = v_have THEN
            PERFORM 1 FROM pgquota.counter_lock c
            WHERE (c.quota_name, c.member) IN (SELECT t.q, t.m FROM unnest(p_quota_names, p_members) t(q, m))
            ORDER BY c.quota_name, c.member
            FOR UPDATE OF c;
        END IF;
        IF v_keys <> v_have OR NOT FOUND AND v_keys > 0 THEN
            FOR r IN
                SELECT DISTINCT t.q, t.m FROM unnest(p_quota_names, p_members) t(q, m)
                JOIN pgquota.quota qq ON qq.name = t.q
                ORDER BY t.q, t.m
            LOOP
                INSERT INTO pgquota.counter_lock AS c (quota_name, member)
                VALUES (r.q, r.m)
                ON CONFLICT ON CONSTRAINT counter_lock_pkey DO NOTHING;
                PERFORM 1 FROM pgquota.counter_lock c
                WHERE c.quota_name = r.q AND c.member = r.m
                FOR UPDATE;
            END LOOP;
        END IF;
    END IF;
    v_at := pgquota.clock();
    LOOP
        v_todo := array(SELECT generate_series(1, v_n));
        v_lo := '-infinity';
        v_hi := 'infinity';
        o_i := '{}'; o_lim := '{}'; o_ws := '{}'; o_we := '{}'; o_wr := '{}'; o_bef := '{}'; o_aft := '{}';
        w_q := '{}'; w_m := '{}'; w_ws := '{}'; w_we := '{}'; w_bef := '{}';
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
                SELECT g.i, g.quota_name AS q, g.member AS m, g.implicit_limit AS lim,
                       g.window_start AS ws, g.window_end AS we,
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
                v_lo := greatest(v_lo, r.ws);
                v_hi := least(v_hi, r.we);
                o_i := o_i || r.i;
                o_lim := o_lim || r.lim;
                o_ws := o_ws || r.ws;
                o_we := o_we || r.we;
                o_wr := o_wr || (r.upd_before IS NOT NULL OR r.ins_used IS NOT NULL);
                o_bef := o_bef || coalesce(r.upd_before, CASE WHEN r.ins_used IS NOT NULL THEN 0 END, r.fresh_used);
                o_aft := o_aft || coalesce(r.upd_after, r.ins_used, r.fresh_used);
                IF r.upd_before IS NOT NULL OR r.ins_used IS NOT NULL THEN
                    w_q := w_q || r.q;
                    w_m := w_m || r.m;
                    w_ws := w_ws || r.ws;
                    w_we := w_we || r.we;
                    w_bef := w_bef || coalesce(r.upd_before, 0);
                END IF;
            END LOOP;
            v_todo := v_again;
        END LOOP;
        -- Every lock is held: the decision's instant, if every window holds it.
        v_now := pgquota.clock();
        EXIT WHEN v_now >= v_lo AND v_now < v_hi;
        -- A boundary passed: undo this pass's writes (the rows are still
        -- held) and decide again in the windows of the new instant.
        UPDATE pgquota.usage u SET used = w.bef
        FROM unnest(w_q, w_m, w_ws, w_we, w_bef) AS w(q, m, ws, we, bef)
        WHERE u.quota_name = w.q AND u.member = w.m AND u.window_start = w.ws AND u.window_end = w.we;
        v_at := v_now;
    END LOOP;
    RETURN QUERY
        SELECT x.i, x.lim, x.ws, x.we, x.wr, x.bef, x.aft, v_now
        FROM unnest(o_i, o_lim, o_ws, o_we, o_wr, o_bef, o_aft) AS x(i, lim, ws, we, wr, bef, aft);
END
$$;
-- +goose StatementEnd

-- The application role gets the new table and functions (see 00011).
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
-- 00011's grant_limits and 00016's grant_limits_batch, as they were. The
-- TATs written meanwhile are in microseconds, as before.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_limits(p_quotas text[], p_member text, p_amount bigint, p_limit bigint)
RETURNS TABLE (
    ord integer, quota_name text, kind text, found boolean, decided boolean,
    limit_value bigint, burst bigint, period_us bigint, fits boolean, granted boolean,
    used bigint, remaining bigint, window_start timestamptz, window_end timestamptz,
    retry_after_us bigint, reset_after_us bigint, decided_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_variable
DECLARE
    n        integer := coalesce(cardinality(p_quotas), 0);
    k_kind   text[] := '{}';
    k_tz     text[] := '{}';
    k_found  boolean[] := '{}';
    k_limit  bigint[] := '{}';
    k_burst  bigint[] := '{}';
    k_period bigint[] := '{}';
    k_origin timestamptz[] := '{}';
    k_wstart timestamptz[] := '{}';
    k_wend   timestamptz[] := '{}';
    k_fits   boolean[] := '{}';
    k_used   bigint[] := '{}';
    k_rem    bigint[] := '{}';
    k_retry  bigint[] := '{}';
    k_reset  bigint[] := '{}';
    k_tat    numeric[] := '{}';
    k_stamps text[] := '{}';   -- the kept rolling entries, as text arrays (written back on a grant)
    k_units  text[] := '{}';
    v_order  integer[];
    v_ok     boolean := true;
    v_all    boolean := true;
    v_now    timestamptz;
    v_now_us numeric;
    v_stable boolean;
    i        integer;
    j        integer;
    r        record;
    v_start  timestamptz;
    v_end    timestamptz;
    v_used   bigint;
    v_t      numeric;
    v_tat    numeric;
    v_new    numeric;
    v_diff   numeric;
    v_st     timestamptz[];
    v_un     bigint[];
    v_keep_st timestamptz[];
    v_keep_un bigint[];
    v_cur    bigint;
    v_drop   bigint;
BEGIN
    -- The arguments: a bad one raises 22023 naming it, before anything is
    -- read (Go's callers check them first; this guards the SQL interface).
    IF n = 0 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_quotas must name at least one quota' USING ERRCODE = '22023';
    ELSIF p_member IS NULL OR octet_length(p_member) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_member must be 1 to 255 bytes, got %',
            coalesce(octet_length(p_member) || ' bytes', 'NULL') USING ERRCODE = '22023';
    ELSIF p_member ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_member must not contain control characters' USING ERRCODE = '22023';
    ELSIF p_amount IS NULL OR p_amount < 1 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_amount must be at least 1, got %', coalesce(p_amount::text, 'NULL')
            USING ERRCODE = '22023';
    ELSIF p_limit < 0 THEN
        RAISE EXCEPTION 'pgquota.grant_limits: p_limit must be at least 0 (or NULL), got %', p_limit USING ERRCODE = '22023';
    END IF;
    -- Definitions and limits: nothing is locked or written unless all are
    -- usable.
    FOR i IN 1 .. n LOOP
        SELECT q.window_unit, q.time_zone,
               coalesce(p_limit, o.limit_value, q.default_limit) AS lim,
               s.period_us AS per, s.burst AS bur, s.origin AS ori
        INTO r
        FROM pgquota.quota q
        LEFT JOIN pgquota.quota_shape s ON s.quota_name = q.name
        LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = p_member
        WHERE q.name = p_quotas[i];
        IF NOT FOUND THEN
            k_found[i] := false; v_ok := false;
            CONTINUE;
        END IF;
        k_found[i] := true;
        k_kind[i] := r.window_unit;
        k_tz[i] := r.time_zone;
        k_limit[i] := r.lim;
        k_period[i] := r.per;
        k_origin[i] := r.ori;
        k_burst[i] := CASE WHEN r.window_unit = 'rate' THEN coalesce(r.bur, r.lim) END;
        IF r.lim IS NULL
           OR (r.window_unit IN ('rate', 'fixed', 'rolling') AND r.per IS NULL)
           OR (r.window_unit = 'rolling' AND r.lim > 10000) THEN
            v_ok := false;
        END IF;
    END LOOP;
    IF NOT v_ok THEN
        RETURN QUERY SELECT g.i, p_quotas[g.i], k_kind[g.i], k_found[g.i], false, k_limit[g.i], k_burst[g.i], k_period[g.i],
                            false, false, 0::bigint, 0::bigint, NULL::timestamptz, NULL::timestamptz,
                            0::bigint, 0::bigint, NULL::timestamptz
                     FROM generate_series(1, n) g(i);
        RETURN;
    END IF;

    SELECT array_agg(g.i ORDER BY p_quotas[g.i], g.i) INTO v_order FROM generate_series(1, n) g(i);

    -- Lock every state row, creating missing ones at their initial state.
    -- Windows are computed from the clock; when the clock read after the
    -- locks lies in another window (a boundary passed during a lock wait),
    -- that window's row is locked too and the check repeats.
    v_now := pgquota.clock();
    LOOP
        v_stable := true;
        FOREACH i IN ARRAY v_order LOOP
            IF k_kind[i] IN ('none', 'hour', 'day', 'week', 'month', 'fixed') THEN
                IF k_kind[i] = 'fixed' THEN
                    v_start := k_origin[i] + (floor((extract(epoch FROM v_now) - extract(epoch FROM k_origin[i])) * 1000000 / k_period[i])
                                              * k_period[i]) * interval '1 microsecond';
                    v_end := v_start + k_period[i] * interval '1 microsecond';
                ELSE
                    v_start := pgquota.window_start(k_kind[i], k_tz[i], v_now);
                    v_end := pgquota.window_end(k_kind[i], k_tz[i], v_now);
                END IF;
                IF k_wstart[i] IS NOT DISTINCT FROM v_start AND k_wend[i] IS NOT DISTINCT FROM v_end THEN
                    CONTINUE;
                END IF;
                v_stable := false;
                k_wstart[i] := v_start;
                k_wend[i] := v_end;
                INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used)
                VALUES (p_quotas[i], p_member, v_start, v_end, 0)
                ON CONFLICT ON CONSTRAINT usage_pkey DO NOTHING;
                SELECT u.used INTO v_used FROM pgquota.usage u
                WHERE u.quota_name = p_quotas[i] AND u.member = p_member
                  AND u.window_start = v_start AND u.window_end = v_end
                FOR UPDATE;
                k_used[i] := v_used;
            ELSIF k_tat[i] IS NULL AND k_kind[i] = 'rate' THEN
                v_stable := false;
                INSERT INTO pgquota.rate_state AS s (quota_name, member, tat_us)
                VALUES (p_quotas[i], p_member, 0)
                ON CONFLICT ON CONSTRAINT rate_state_pkey DO NOTHING;
                SELECT s.tat_us INTO v_tat FROM pgquota.rate_state s
                WHERE s.quota_name = p_quotas[i] AND s.member = p_member
                FOR UPDATE;
                k_tat[i] := v_tat;
            ELSIF k_stamps[i] IS NULL AND k_kind[i] = 'rolling' THEN
                v_stable := false;
                INSERT INTO pgquota.rolling_usage AS s (quota_name, member, stamps, units)
                VALUES (p_quotas[i], p_member, '{}', '{}')
                ON CONFLICT ON CONSTRAINT rolling_usage_pkey DO NOTHING;
                SELECT s.stamps, s.units INTO v_st, v_un FROM pgquota.rolling_usage s
                WHERE s.quota_name = p_quotas[i] AND s.member = p_member
                FOR UPDATE;
                k_stamps[i] := v_st::text;
                k_units[i] := v_un::text;
            END IF;
        END LOOP;
        v_now := pgquota.clock();
        EXIT WHEN v_stable;
    END LOOP;
    v_now_us := extract(epoch FROM v_now) * 1000000;

    -- Decide every quota on its locked row.
    FOR i IN 1 .. n LOOP
        IF k_kind[i] = 'rate' THEN
            IF k_limit[i] = 0 OR p_amount > k_burst[i] THEN
                -- limit 0 grants nothing; an amount above the burst never fits.
                k_fits[i] := false;
                k_retry[i] := -1;
                k_rem[i] := CASE WHEN k_limit[i] = 0 THEN 0
                                 ELSE least(k_burst[i], greatest(0, floor((v_now_us - greatest(k_tat[i], v_now_us)) * k_limit[i] / k_period[i] + k_burst[i])))::bigint END;
                k_reset[i] := CASE WHEN k_limit[i] = 0 THEN -1 ELSE least(ceil(greatest(k_tat[i] - v_now_us, 0)), 9223372036854775807)::bigint END;
            ELSE
                -- GCRA (the ATM Forum's generic cell rate algorithm, in the
                -- form of go-redis/redis_rate): emission interval T =
                -- period/limit, tolerance burst*T.
                v_t := k_period[i]::numeric / k_limit[i];
                v_tat := greatest(k_tat[i], v_now_us);
                v_new := v_tat + p_amount * v_t;
                v_diff := v_now_us - (v_new - k_burst[i] * v_t);
                IF v_diff >= 0 THEN
                    k_fits[i] := true;
                    k_tat[i] := v_new;
                    k_retry[i] := 0;
                    k_rem[i] := least(k_burst[i], floor(v_diff / v_t))::bigint;
                    k_reset[i] := least(ceil(v_new - v_now_us), 9223372036854775807)::bigint;
                ELSE
                    k_fits[i] := false;
                    k_retry[i] := least(ceil(-v_diff), 9223372036854775807)::bigint;
                    k_rem[i] := least(k_burst[i], greatest(0, floor((v_now_us - (v_tat - k_burst[i] * v_t)) / v_t)))::bigint;
                    k_reset[i] := least(ceil(v_tat - v_now_us), 9223372036854775807)::bigint;
                END IF;
            END IF;
            k_used[i] := k_burst[i] - k_rem[i];
        ELSIF k_kind[i] = 'rolling' THEN
            -- Keep the grants of the last period: stamps newer than now - W.
            v_st := k_stamps[i]::timestamptz[];
            v_un := k_units[i]::bigint[];
            v_keep_st := '{}';
            v_keep_un := '{}';
            v_cur := 0;
            FOR j IN 1 .. coalesce(cardinality(v_st), 0) LOOP
                IF v_st[j] > v_now - k_period[i] * interval '1 microsecond' THEN
                    v_keep_st := v_keep_st || v_st[j];
                    v_keep_un := v_keep_un || v_un[j];
                    v_cur := v_cur + v_un[j];
                END IF;
            END LOOP;
            IF v_cur + p_amount <= k_limit[i] THEN
                k_fits[i] := true;
                k_retry[i] := 0;
                v_keep_st := v_keep_st || v_now;
                v_keep_un := v_keep_un || p_amount;
                v_cur := v_cur + p_amount;
            ELSE
                k_fits[i] := false;
                IF p_amount > k_limit[i] THEN
                    k_retry[i] := -1;
                ELSE
                    -- The earliest instant at which enough of the oldest
                    -- grants have left the window: when the oldest entry k
                    -- whose removal makes room leaves (stamp + W).
                    v_drop := 0;
                    FOR j IN 1 .. cardinality(v_keep_st) LOOP
                        v_drop := v_drop + v_keep_un[j];
                        IF v_cur - v_drop + p_amount <= k_limit[i] THEN
                            k_retry[i] := ceil(extract(epoch FROM (v_keep_st[j] - v_now)) * 1000000 + k_period[i])::bigint;
                            EXIT;
                        END IF;
                    END LOOP;
                END IF;
            END IF;
            k_stamps[i] := v_keep_st::text;
            k_units[i] := v_keep_un::text;
            k_used[i] := v_cur;
            k_rem[i] := greatest(k_limit[i] - v_cur, 0);
            k_reset[i] := CASE WHEN cardinality(v_keep_st) = 0 THEN 0
                               ELSE greatest(ceil(extract(epoch FROM (v_keep_st[cardinality(v_keep_st)] - v_now)) * 1000000 + k_period[i]), 0)::bigint END;
        ELSE
            -- A counter per window (calendar or fixed).
            k_fits[i] := k_used[i] + p_amount <= k_limit[i];
            IF k_fits[i] THEN
                k_used[i] := k_used[i] + p_amount;
                k_retry[i] := 0;
            ELSIF p_amount > k_limit[i] OR k_kind[i] = 'none' THEN
                k_retry[i] := -1;
            ELSE
                k_retry[i] := ceil(extract(epoch FROM (k_wend[i] - v_now)) * 1000000)::bigint;
            END IF;
            k_rem[i] := greatest(k_limit[i] - k_used[i], 0);
            k_reset[i] := CASE WHEN k_kind[i] = 'none' THEN -1
                               ELSE ceil(extract(epoch FROM (k_wend[i] - v_now)) * 1000000)::bigint END;
        END IF;
        v_all := v_all AND k_fits[i];
    END LOOP;

    IF v_all THEN
        PERFORM pgquota.durable_commit();
        FOR i IN 1 .. n LOOP
            IF k_kind[i] = 'rate' THEN
                UPDATE pgquota.rate_state s SET tat_us = k_tat[i], updated_at = v_now
                WHERE s.quota_name = p_quotas[i] AND s.member = p_member;
            ELSIF k_kind[i] = 'rolling' THEN
                UPDATE pgquota.rolling_usage s
                SET stamps = k_stamps[i]::timestamptz[], units = k_units[i]::bigint[], updated_at = v_now
                WHERE s.quota_name = p_quotas[i] AND s.member = p_member;
            ELSE
                UPDATE pgquota.usage u SET used = k_used[i], updated_at = v_now
                WHERE u.quota_name = p_quotas[i] AND u.member = p_member
                  AND u.window_start = k_wstart[i] AND u.window_end = k_wend[i];
            END IF;
        END LOOP;
    ELSE
        -- Nothing moves: report the states as they were, for the quotas
        -- that had room too.
        FOR i IN 1 .. n LOOP
            CONTINUE WHEN NOT k_fits[i];
            IF k_kind[i] = 'rate' THEN
                v_t := k_period[i]::numeric / k_limit[i];
                k_rem[i] := least(k_burst[i], k_rem[i] + p_amount);
                k_used[i] := k_burst[i] - k_rem[i];
                k_reset[i] := least(ceil(greatest(k_tat[i] - p_amount * v_t - v_now_us, 0)), 9223372036854775807)::bigint;
            ELSIF k_kind[i] = 'rolling' THEN
                v_st := k_stamps[i]::timestamptz[];
                k_used[i] := k_used[i] - p_amount;
                k_rem[i] := greatest(k_limit[i] - k_used[i], 0);
                k_reset[i] := CASE WHEN cardinality(v_st) <= 1 THEN 0
                                   ELSE greatest(ceil(extract(epoch FROM (v_st[cardinality(v_st) - 1] - v_now)) * 1000000 + k_period[i]), 0)::bigint END;
            ELSE
                k_used[i] := k_used[i] - p_amount;
                k_rem[i] := greatest(k_limit[i] - k_used[i], 0);
            END IF;
        END LOOP;
    END IF;

    RETURN QUERY SELECT g.i, p_quotas[g.i], k_kind[g.i], true, true, k_limit[g.i], k_burst[g.i], k_period[g.i],
                        k_fits[g.i], v_all, k_used[g.i], k_rem[g.i],
                        CASE WHEN k_kind[g.i] IN ('rate', 'rolling') OR k_kind[g.i] = 'none' THEN NULL ELSE k_wstart[g.i] END,
                        CASE WHEN k_kind[g.i] IN ('rate', 'rolling') OR k_kind[g.i] = 'none' THEN NULL ELSE k_wend[g.i] END,
                        k_retry[g.i], k_reset[g.i], v_now
                 FROM generate_series(1, n) g(i);
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_limits_batch(
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
-- 00016's usage_grant_batch, as it was.
-- +goose StatementBegin
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
DROP TABLE pgquota.counter_lock;
DROP FUNCTION pgquota.ceil_div(numeric, numeric);
DROP FUNCTION pgquota.floor_div(numeric, numeric);
