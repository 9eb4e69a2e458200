-- Set-based grant batches: pgquota.grant_limits_batch (00016, 00020),
-- Go's batch statement for quotas of the kinds rate, fixed and rolling and
-- for grants naming several quotas (queries/rate_batch.sql, used by
-- Config.GroupCommit, Config.Coalesce and GrantBatch), ran
-- pgquota.grant_limits_row once per request: every request read its
-- quotas' definitions, locked and read its state rows again (already held
-- by the batch), read the clock and wrote its rows, so a batch of 64
-- grants on one hot rate counter updated the same row 64 times and spent
-- its time in PL/pgSQL per call (issue 23, item 2).
--
-- Now the batch reads every definition and limit in one query, locks each
-- state row ONCE (in the order of 00020's 2.: first the rows no window
-- names, in (quota, member) order, then the counters of the windows
-- holding the clock's instant, again when a boundary passed during a lock
-- wait), reads the clock once after every lock is held, decides the
-- requests one after another in array order on the states in memory (the
-- arithmetic of grant_limits_row, unchanged: GCRA in units of 1/limit
-- microsecond, a rolling window's kept entries, a window's counter), and
-- writes each changed row ONCE at the end. A request naming several
-- quotas still moves all of them or none.
--
-- Equivalence with the requests run one at a time in array order: each
-- request sees the state the previous ones left, a rate's TAT going
-- through the stored form (microseconds to 30 places) between requests as
-- it does through the row, so the decisions, waits and final rows are
-- those of the one-at-a-time run at the batch's instant. The one
-- difference is the instant: every request of the batch is decided at one
-- reading of the clock (decided_at), taken once every lock is held, where
-- one call at a time read it once per call; a one-at-a-time run at that
-- instant gives the same results (quota/batch_set_equivalence_test.go
-- checks it with a fixed clock).
--
-- The durability call (pgquota.durable_commit, once when any request was
-- granted, before the writes) is in one place, marked below.

-- +goose Up

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
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
#variable_conflict use_variable
DECLARE
    n        integer := coalesce(cardinality(p_members), 0);
    -- Elements: one per (request, quota named), in (request, ord) order.
    e_req    integer[];
    e_ord    integer[];
    e_name   text[];
    e_found  boolean[];
    e_kind   text[];
    e_tz     text[];
    e_limit  bigint[];
    e_burst  bigint[];
    e_period bigint[];
    e_origin timestamptz[];
    e_usable boolean[];
    e_key    integer[];
    ne       integer;
    -- The results of each element.
    o_fits   boolean[] := '{}';
    o_used   bigint[] := '{}';
    o_rem    bigint[] := '{}';
    o_retry  bigint[] := '{}';
    o_reset  bigint[] := '{}';
    o_granted boolean[] := '{}';
    o_tat    numeric[] := '{}';  -- a rate's new TAT, in units of 1/limit us
    o_st     text[] := '{}';     -- a rolling window's kept entries
    o_un     text[] := '{}';
    -- Keys: one per (quota, member) of the usable requests, in
    -- (quota, member) order (the lock order), with its state in memory.
    nk       integer := 0;
    k_name   text[] := '{}';
    k_member text[] := '{}';
    k_kind   text[] := '{}';
    k_tz     text[] := '{}';
    k_period bigint[] := '{}';
    k_origin timestamptz[] := '{}';
    k_tat    numeric[] := '{}';  -- a rate's stored TAT, in us (30 places)
    k_st     text[] := '{}';     -- a rolling window's stored entries
    k_un     text[] := '{}';
    k_used   bigint[] := '{}';   -- a window's counter
    k_wstart timestamptz[] := '{}';
    k_wend   timestamptz[] := '{}';
    k_dirty  boolean[] := '{}';
    v_any    boolean := false;
    v_all    boolean;
    v_now    timestamptz;
    v_now_s  numeric;
    v_stable boolean;
    i        integer;
    j        integer;
    jj       integer;
    k        integer;
    e0       integer;
    e1       integer;
    v_member text;
    v_amount bigint;
    v_start  timestamptz;
    v_end    timestamptz;
    v_used   bigint;
    v_p      numeric;
    v_l      numeric;
    v_b      numeric;
    v_t0     numeric;
    v_tat    numeric;
    v_new    numeric;
    v_diff   numeric;
    v_st     timestamptz[];
    v_un     bigint[];
    v_keep_st timestamptz[];
    v_keep_un bigint[];
    v_cur    bigint;
    v_drop   bigint;
    r_first  integer[];
    r_last   integer[];
BEGIN
    -- The arguments, checked as pgquota.grant_limits_row checks them (22023
    -- naming the bad one), before anything is read.
    FOR i IN 1 .. n LOOP
        v_member := p_members[i];
        IF coalesce(p_counts[i], 0) < 1 THEN
            RAISE EXCEPTION 'pgquota.grant_limits: p_quotas must name at least one quota' USING ERRCODE = '22023';
        ELSIF v_member IS NULL OR octet_length(v_member) NOT BETWEEN 1 AND 255 THEN
            RAISE EXCEPTION 'pgquota.grant_limits: p_member must be 1 to 255 bytes, got %',
                coalesce(octet_length(v_member) || ' bytes', 'NULL') USING ERRCODE = '22023';
        ELSIF v_member ~ '[\x01-\x1f\x7f-\x9f]' THEN
            RAISE EXCEPTION 'pgquota.grant_limits: p_member must not contain control characters' USING ERRCODE = '22023';
        ELSIF p_amounts[i] IS NULL OR p_amounts[i] < 1 THEN
            RAISE EXCEPTION 'pgquota.grant_limits: p_amount must be at least 1, got %', coalesce(p_amounts[i]::text, 'NULL')
                USING ERRCODE = '22023';
        ELSIF p_limits[i] < 0 AND p_limits[i] <> -1 THEN
            RAISE EXCEPTION 'pgquota.grant_limits: p_limit must be at least 0 (or NULL), got %', p_limits[i] USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF n = 0 THEN
        RETURN;
    END IF;

    -- Every definition and limit, in one query. A request is usable when
    -- every quota it names exists with a limit (and a shape where its kind
    -- needs one); its (quota, member) pairs are numbered in lock order.
    WITH req AS (
        SELECT t.i AS l_i, p_members[t.i] AS l_member, nullif(p_limits[t.i], -1) AS l_limit,
               p_quota_names[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS l_names
        FROM generate_series(1, n) t(i)
    ), el AS (
        SELECT rq.l_i, x.l_ord::integer AS l_ord, x.l_name, rq.l_member, q.name IS NOT NULL AS l_found,
               q.window_unit AS l_unit, q.time_zone AS l_tz,
               coalesce(rq.l_limit, o.limit_value, q.default_limit) AS l_limit,
               s.period_us AS l_period, s.burst AS l_burst, s.origin AS l_origin
        FROM req rq
        CROSS JOIN LATERAL unnest(rq.l_names) WITH ORDINALITY AS x(l_name, l_ord)
        LEFT JOIN pgquota.quota q ON q.name = x.l_name
        LEFT JOIN pgquota.quota_shape s ON s.quota_name = q.name
        LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = rq.l_member
    ), us AS (
        SELECT e.*,
               bool_and(e.l_found AND e.l_limit IS NOT NULL
                        AND (e.l_unit NOT IN ('rate', 'fixed', 'rolling') OR e.l_period IS NOT NULL)
                        AND NOT (e.l_unit = 'rolling' AND e.l_limit > 10000)) OVER (PARTITION BY e.l_i) AS l_usable
        FROM el e
    ), ky AS (
        SELECT u.*, dense_rank() OVER (PARTITION BY u.l_usable ORDER BY u.l_name, u.l_member)::integer AS l_key
        FROM us u
    )
    SELECT array_agg(y.l_i ORDER BY y.l_i, y.l_ord), array_agg(y.l_ord ORDER BY y.l_i, y.l_ord),
           array_agg(y.l_name ORDER BY y.l_i, y.l_ord), array_agg(y.l_found ORDER BY y.l_i, y.l_ord),
           array_agg(y.l_unit ORDER BY y.l_i, y.l_ord), array_agg(y.l_tz ORDER BY y.l_i, y.l_ord),
           array_agg(CASE WHEN y.l_found THEN y.l_limit END ORDER BY y.l_i, y.l_ord),
           array_agg(CASE WHEN y.l_unit = 'rate' THEN coalesce(y.l_burst, y.l_limit) END ORDER BY y.l_i, y.l_ord),
           array_agg(y.l_period ORDER BY y.l_i, y.l_ord), array_agg(y.l_origin ORDER BY y.l_i, y.l_ord),
           array_agg(y.l_usable ORDER BY y.l_i, y.l_ord),
           array_agg(CASE WHEN y.l_usable THEN y.l_key END ORDER BY y.l_i, y.l_ord)
    INTO e_req, e_ord, e_name, e_found, e_kind, e_tz, e_limit, e_burst, e_period, e_origin, e_usable, e_key
    FROM ky y;
    ne := coalesce(cardinality(e_req), 0);

    r_first := array_fill(0, ARRAY[n]);
    r_last := array_fill(-1, ARRAY[n]);
    FOR j IN 1 .. ne LOOP
        IF r_first[e_req[j]] = 0 THEN
            r_first[e_req[j]] := j;
        END IF;
        r_last[e_req[j]] := j;
        k := e_key[j];
        CONTINUE WHEN k IS NULL;
        IF k > nk THEN
            nk := k;
        END IF;
        k_name[k] := e_name[j];
        k_member[k] := p_members[e_req[j]];
        k_kind[k] := e_kind[j];
        k_tz[k] := e_tz[j];
        k_period[k] := e_period[j];
        k_origin[k] := e_origin[j];
        k_dirty[k] := false;
    END LOOP;

    -- The locks, each row once. First the rows no window names, in
    -- (quota, member) order: a rate's or a rolling window's state row, and,
    -- when the batch names several (quota, member) pairs, a counter quota's
    -- pgquota.counter_lock row (missing rows are created first at their
    -- initial state).
    FOR k IN 1 .. nk LOOP
        IF k_kind[k] = 'rate' THEN
            INSERT INTO pgquota.rate_state AS s (quota_name, member, tat_us)
            VALUES (k_name[k], k_member[k], 0)
            ON CONFLICT ON CONSTRAINT rate_state_pkey DO NOTHING;
            SELECT s.tat_us INTO v_tat FROM pgquota.rate_state s
            WHERE s.quota_name = k_name[k] AND s.member = k_member[k]
            FOR UPDATE;
            k_tat[k] := v_tat;
        ELSIF k_kind[k] = 'rolling' THEN
            INSERT INTO pgquota.rolling_usage AS s (quota_name, member, stamps, units)
            VALUES (k_name[k], k_member[k], '{}', '{}')
            ON CONFLICT ON CONSTRAINT rolling_usage_pkey DO NOTHING;
            SELECT s.stamps, s.units INTO v_st, v_un FROM pgquota.rolling_usage s
            WHERE s.quota_name = k_name[k] AND s.member = k_member[k]
            FOR UPDATE;
            k_st[k] := v_st::text;
            k_un[k] := v_un::text;
        ELSIF nk > 1 THEN
            INSERT INTO pgquota.counter_lock AS c (quota_name, member)
            VALUES (k_name[k], k_member[k])
            ON CONFLICT ON CONSTRAINT counter_lock_pkey DO NOTHING;
            PERFORM 1 FROM pgquota.counter_lock c
            WHERE c.quota_name = k_name[k] AND c.member = k_member[k]
            FOR UPDATE;
        END IF;
    END LOOP;

    -- Then the counters of the windows holding the clock's instant, in
    -- (quota, member) order, read after every lock above is held; when a
    -- window changed meanwhile (a boundary passed during a lock wait), the
    -- new window's counter is locked too and the clock read again. The
    -- instant the windows were last checked against is every request's
    -- decision instant.
    v_now := pgquota.clock();
    LOOP
        v_stable := true;
        FOR k IN 1 .. nk LOOP
            CONTINUE WHEN k_kind[k] NOT IN ('none', 'hour', 'day', 'week', 'month', 'fixed');
            IF k_kind[k] = 'fixed' THEN
                v_start := k_origin[k] + (pgquota.floor_div((extract(epoch FROM v_now) - extract(epoch FROM k_origin[k])) * 1000000, k_period[k])
                                          * k_period[k]) * interval '1 microsecond';
                v_end := v_start + k_period[k] * interval '1 microsecond';
            ELSE
                v_start := pgquota.window_start(k_kind[k], k_tz[k], v_now);
                v_end := pgquota.window_end(k_kind[k], k_tz[k], v_now);
            END IF;
            IF k_wstart[k] IS NOT DISTINCT FROM v_start AND k_wend[k] IS NOT DISTINCT FROM v_end THEN
                CONTINUE;
            END IF;
            v_stable := false;
            k_wstart[k] := v_start;
            k_wend[k] := v_end;
            INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used)
            VALUES (k_name[k], k_member[k], v_start, v_end, 0)
            ON CONFLICT ON CONSTRAINT usage_pkey DO NOTHING;
            SELECT u.used INTO v_used FROM pgquota.usage u
            WHERE u.quota_name = k_name[k] AND u.member = k_member[k]
              AND u.window_start = v_start AND u.window_end = v_end
            FOR UPDATE;
            k_used[k] := v_used;
        END LOOP;
        EXIT WHEN v_stable;
        v_now := pgquota.clock();
    END LOOP;
    v_now_s := extract(epoch FROM v_now) * 1000000;  -- whole microseconds

    -- Decide the requests one after another, in array order, on the states
    -- in memory: grant_limits_row's arithmetic, each element starting from
    -- the state the requests before it left.
    FOR i IN 1 .. n LOOP
        e0 := r_first[i];
        e1 := r_last[i];
        CONTINUE WHEN NOT e_usable[e0];
        v_amount := p_amounts[i];
        v_all := true;
        FOR j IN e0 .. e1 LOOP
            k := e_key[j];
            IF e_kind[j] = 'rate' THEN
                v_p := e_period[j];
                v_l := e_limit[j];
                v_b := e_burst[j];
                -- The stored TAT in units of 1/limit us: an integer.
                v_t0 := round(k_tat[k] * greatest(e_limit[j], 1));
                o_tat[j] := v_t0;
                IF e_limit[j] = 0 OR v_amount > e_burst[j] THEN
                    o_fits[j] := false;
                    o_retry[j] := -1;
                    IF e_limit[j] = 0 THEN
                        o_rem[j] := 0;
                        o_reset[j] := -1;
                    ELSE
                        v_tat := greatest(v_t0, v_now_s * v_l);
                        o_rem[j] := least(v_b, greatest(0, pgquota.floor_div(v_now_s * v_l - (v_tat - v_b * v_p), v_p)))::bigint;
                        o_reset[j] := least(pgquota.ceil_div(v_tat - v_now_s * v_l, v_l), 9223372036854775807)::bigint;
                    END IF;
                ELSE
                    -- GCRA (grant_limits_row, 00020's 3.).
                    v_tat := greatest(v_t0, v_now_s * v_l);
                    v_new := v_tat + v_amount * v_p;
                    v_diff := v_now_s * v_l - (v_new - v_b * v_p);
                    IF v_diff >= 0 THEN
                        o_fits[j] := true;
                        o_tat[j] := v_new;
                        o_retry[j] := 0;
                        o_rem[j] := least(v_b, pgquota.floor_div(v_diff, v_p))::bigint;
                        o_reset[j] := least(pgquota.ceil_div(v_new - v_now_s * v_l, v_l), 9223372036854775807)::bigint;
                    ELSE
                        o_fits[j] := false;
                        o_retry[j] := least(pgquota.ceil_div(-v_diff, v_l), 9223372036854775807)::bigint;
                        o_rem[j] := least(v_b, greatest(0, pgquota.floor_div(v_now_s * v_l - (v_tat - v_b * v_p), v_p)))::bigint;
                        o_reset[j] := least(pgquota.ceil_div(v_tat - v_now_s * v_l, v_l), 9223372036854775807)::bigint;
                    END IF;
                END IF;
                o_used[j] := e_burst[j] - o_rem[j];
            ELSIF e_kind[j] = 'rolling' THEN
                v_st := k_st[k]::timestamptz[];
                v_un := k_un[k]::bigint[];
                v_keep_st := '{}';
                v_keep_un := '{}';
                v_cur := 0;
                FOR jj IN 1 .. coalesce(cardinality(v_st), 0) LOOP
                    IF v_st[jj] > v_now - e_period[j] * interval '1 microsecond' THEN
                        v_keep_st := v_keep_st || v_st[jj];
                        v_keep_un := v_keep_un || v_un[jj];
                        v_cur := v_cur + v_un[jj];
                    END IF;
                END LOOP;
                IF v_cur + v_amount <= e_limit[j] THEN
                    o_fits[j] := true;
                    o_retry[j] := 0;
                    v_keep_st := v_keep_st || v_now;
                    v_keep_un := v_keep_un || v_amount;
                    v_cur := v_cur + v_amount;
                ELSE
                    o_fits[j] := false;
                    o_retry[j] := NULL;
                    IF v_amount > e_limit[j] THEN
                        o_retry[j] := -1;
                    ELSE
                        v_drop := 0;
                        FOR jj IN 1 .. cardinality(v_keep_st) LOOP
                            v_drop := v_drop + v_keep_un[jj];
                            IF v_cur - v_drop + v_amount <= e_limit[j] THEN
                                o_retry[j] := ceil(extract(epoch FROM (v_keep_st[jj] - v_now)) * 1000000 + e_period[j])::bigint;
                                EXIT;
                            END IF;
                        END LOOP;
                    END IF;
                END IF;
                o_st[j] := v_keep_st::text;
                o_un[j] := v_keep_un::text;
                o_used[j] := v_cur;
                o_rem[j] := greatest(e_limit[j] - v_cur, 0);
                o_reset[j] := CASE WHEN cardinality(v_keep_st) = 0 THEN 0
                                   ELSE greatest(ceil(extract(epoch FROM (v_keep_st[cardinality(v_keep_st)] - v_now)) * 1000000 + e_period[j]), 0)::bigint END;
            ELSE
                -- A counter per window (calendar or fixed), whose window holds v_now.
                o_fits[j] := k_used[k] + v_amount <= e_limit[j];
                o_used[j] := k_used[k];
                IF o_fits[j] THEN
                    o_used[j] := k_used[k] + v_amount;
                    o_retry[j] := 0;
                ELSIF v_amount > e_limit[j] OR e_kind[j] = 'none' THEN
                    o_retry[j] := -1;
                ELSE
                    o_retry[j] := ceil(extract(epoch FROM (k_wend[k] - v_now)) * 1000000)::bigint;
                END IF;
                o_rem[j] := greatest(e_limit[j] - o_used[j], 0);
                o_reset[j] := CASE WHEN e_kind[j] = 'none' THEN -1
                                   ELSE ceil(extract(epoch FROM (k_wend[k] - v_now)) * 1000000)::bigint END;
            END IF;
            v_all := v_all AND o_fits[j];
        END LOOP;

        IF v_all THEN
            -- The request moves every state it names, in its order (as its
            -- writes would).
            v_any := true;
            FOR j IN e0 .. e1 LOOP
                k := e_key[j];
                k_dirty[k] := true;
                IF e_kind[j] = 'rate' THEN
                    k_tat[k] := trim_scale(round(o_tat[j], 30) / e_limit[j]);
                ELSIF e_kind[j] = 'rolling' THEN
                    k_st[k] := o_st[j];
                    k_un[k] := o_un[j];
                ELSE
                    k_used[k] := o_used[j];
                END IF;
            END LOOP;
        ELSE
            -- Nothing moves: report the states as they were, for the
            -- quotas that had room too.
            FOR j IN e0 .. e1 LOOP
                CONTINUE WHEN NOT o_fits[j];
                IF e_kind[j] = 'rate' THEN
                    o_rem[j] := least(e_burst[j], o_rem[j] + v_amount);
                    o_used[j] := e_burst[j] - o_rem[j];
                    o_reset[j] := least(pgquota.ceil_div(greatest(o_tat[j] - v_amount * e_period[j]::numeric - v_now_s * e_limit[j], 0),
                                                          e_limit[j]), 9223372036854775807)::bigint;
                ELSIF e_kind[j] = 'rolling' THEN
                    v_st := o_st[j]::timestamptz[];
                    o_used[j] := o_used[j] - v_amount;
                    o_rem[j] := greatest(e_limit[j] - o_used[j], 0);
                    o_reset[j] := CASE WHEN cardinality(v_st) <= 1 THEN 0
                                       ELSE greatest(ceil(extract(epoch FROM (v_st[cardinality(v_st) - 1] - v_now)) * 1000000 + e_period[j]), 0)::bigint END;
                ELSE
                    o_used[j] := o_used[j] - v_amount;
                    o_rem[j] := greatest(e_limit[j] - o_used[j], 0);
                END IF;
            END LOOP;
        END IF;
        FOR j IN e0 .. e1 LOOP
            o_granted[j] := v_all;
        END LOOP;
    END LOOP;

    -- Durability: one call for the batch when any request was granted,
    -- before its writes (grant_limits_row calls it before its own).
    IF v_any THEN
        PERFORM pgquota.durable_commit();
    END IF;

    -- The writes: each changed row once, with the state the last request
    -- that moved it left.
    FOR k IN 1 .. nk LOOP
        CONTINUE WHEN NOT k_dirty[k];
        IF k_kind[k] = 'rate' THEN
            UPDATE pgquota.rate_state s SET tat_us = k_tat[k], updated_at = v_now
            WHERE s.quota_name = k_name[k] AND s.member = k_member[k];
        ELSIF k_kind[k] = 'rolling' THEN
            UPDATE pgquota.rolling_usage s
            SET stamps = k_st[k]::timestamptz[], units = k_un[k]::bigint[], updated_at = v_now
            WHERE s.quota_name = k_name[k] AND s.member = k_member[k];
        ELSE
            UPDATE pgquota.usage u SET used = k_used[k], updated_at = v_now
            WHERE u.quota_name = k_name[k] AND u.member = k_member[k]
              AND u.window_start = k_wstart[k] AND u.window_end = k_wend[k];
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT e_req[g.j], e_ord[g.j], e_name[g.j], e_kind[g.j], e_found[g.j], e_usable[g.j],
           e_limit[g.j], e_burst[g.j], e_period[g.j],
           CASE WHEN e_usable[g.j] THEN o_fits[g.j] ELSE false END,
           CASE WHEN e_usable[g.j] THEN o_granted[g.j] ELSE false END,
           CASE WHEN e_usable[g.j] THEN o_used[g.j] ELSE 0::bigint END,
           CASE WHEN e_usable[g.j] THEN o_rem[g.j] ELSE 0::bigint END,
           CASE WHEN e_usable[g.j] AND e_kind[g.j] NOT IN ('rate', 'rolling', 'none') THEN k_wstart[e_key[g.j]] END,
           CASE WHEN e_usable[g.j] AND e_kind[g.j] NOT IN ('rate', 'rolling', 'none') THEN k_wend[e_key[g.j]] END,
           CASE WHEN e_usable[g.j] THEN o_retry[g.j] ELSE 0::bigint END,
           CASE WHEN e_usable[g.j] THEN o_reset[g.j] ELSE 0::bigint END,
           CASE WHEN e_usable[g.j] THEN v_now END
    FROM generate_series(1, ne) g(j);
END
$$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_limits_batch(p_quota_names text[], p_firsts integer[], p_counts integer[], p_members text[], p_amounts bigint[], p_limits bigint[])
 RETURNS TABLE(req_index integer, ord integer, quota_name text, kind text, found boolean, decided boolean, limit_value bigint, burst bigint, period_us bigint, fits boolean, granted boolean, used bigint, remaining bigint, window_start timestamp with time zone, window_end timestamp with time zone, retry_after_us bigint, reset_after_us bigint, decided_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgquota', 'pg_temp'
AS $function$
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
        FROM pgquota.grant_limits_row(p_quota_names[p_firsts[i] : p_firsts[i] + p_counts[i] - 1],
                                  p_members[i], p_amounts[i], nullif(p_limits[i], -1)) g
        ORDER BY g.ord;
    END LOOP;
END
$function$
;
-- +goose StatementEnd
