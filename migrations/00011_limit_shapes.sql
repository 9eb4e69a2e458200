-- Limit shapes beside the calendar windows: a rate with a burst (GCRA),
-- fixed windows of any length aligned to an origin, a rolling window, and
-- grants checked against several quotas at once (all or nothing).
--
-- A quota of a new kind is a row of pgquota.quota whose window_unit is
-- 'rate', 'fixed' or 'rolling', with its shape in pgquota.quota_shape. Its
-- limit is the quota's default_limit (or the member's override, or the
-- call's limit), as for the calendar windows:
--   * rate:    limit units per period_us, at most burst at once (GCRA);
--   * fixed:   limit units per window of period_us microseconds, windows cut
--              at origin + k * period_us; counters in pgquota.usage, as for
--              the calendar windows;
--   * rolling: at most limit units in any period of period_us microseconds.
-- Every grant of these kinds, and every grant against several quotas, is
-- one call of pgquota.grant_limits (one statement, one round trip).

-- +goose Up
ALTER TABLE pgquota.quota DROP CONSTRAINT quota_window_unit;
ALTER TABLE pgquota.quota ADD CONSTRAINT quota_window_unit
    CHECK (window_unit IN ('none', 'hour', 'day', 'week', 'month', 'rate', 'fixed', 'rolling'));

-- The shape of a quota of kind rate, fixed or rolling (one row per quota; a
-- calendar quota's row, left from an earlier definition, is ignored).
CREATE TABLE pgquota.quota_shape (
    quota_name text        NOT NULL PRIMARY KEY REFERENCES pgquota.quota (name) ON DELETE CASCADE,
    -- period_us: the rate's period, the fixed window's length, or the
    -- rolling window's length, in microseconds (1 ms to 100 years).
    period_us  bigint      NOT NULL,
    -- burst: the most units a rate grants at once; NULL: the limit.
    burst      bigint,
    -- origin: where fixed windows are cut (origin + k * period).
    origin     timestamptz NOT NULL DEFAULT 'epoch',
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT quota_shape_period CHECK (period_us BETWEEN 1000 AND 3155760000000000 AND period_us % 1000 = 0),
    CONSTRAINT quota_shape_burst CHECK (burst >= 1),
    CONSTRAINT quota_shape_origin CHECK (isfinite(origin))
);

-- GCRA state: the theoretical arrival time, in microseconds since the Unix
-- epoch, exact (numeric: the emission interval period/limit is rarely a
-- whole number of microseconds). It moves forward only when a grant fits.
CREATE TABLE pgquota.rate_state (
    quota_name text        NOT NULL REFERENCES pgquota.quota (name) ON DELETE CASCADE,
    member     text        NOT NULL,
    tat_us     numeric     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (quota_name, member),
    CONSTRAINT rate_state_member_length CHECK (octet_length(member) BETWEEN 1 AND 255)
);

-- Rolling window state: the grants of the last period, oldest first, as
-- two arrays of the same length (instant of the grant, units). Only grants
-- newer than one period are kept, and they hold at most limit units, so a
-- row holds at most limit entries (limit is at most 10,000 for this kind).
CREATE TABLE pgquota.rolling_usage (
    quota_name text          NOT NULL REFERENCES pgquota.quota (name) ON DELETE CASCADE,
    member     text          NOT NULL,
    stamps     timestamptz[] NOT NULL,
    units      bigint[]      NOT NULL,
    updated_at timestamptz   NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (quota_name, member),
    CONSTRAINT rolling_usage_member_length CHECK (octet_length(member) BETWEEN 1 AND 255),
    CONSTRAINT rolling_usage_same_length CHECK (cardinality(stamps) = cardinality(units))
);

-- pgquota.grant_limits grants p_amount units to p_member under every quota
-- of p_quotas at once, or under none (queries/rate.sql, LimitsGrant, runs
-- it). p_limit, when not NULL, is the limit of every quota of the call
-- (else the member's override, else the quota's default).
--
-- It returns one row per quota, in the order of p_quotas (ord 1..n):
--   * decided = false: nothing was written, because a quota does not exist
--     (found = false), has no limit (limit_value NULL), or is a rolling
--     window whose limit is above 10,000 (limit_value says which);
--   * decided = true: fits says whether this quota had room, granted
--     whether all did (and every state moved), used/remaining the state
--     after the call, retry_after_us the wait until this quota has room
--     for p_amount (0 when it has, -1 when it never will), reset_after_us
--     the wait until it is back to its full limit (-1 never), decided_at
--     the database clock's instant the decision was taken at.
--
-- Why it is exact: every state row the call reads is locked first (FOR
-- UPDATE, in quota-name order, so two calls never wait on each other in a
-- cycle); a missing row is inserted first at its initial state (zero units,
-- an old TAT, no stamps) with ON CONFLICT DO NOTHING, and locked by the next
-- statement, which in READ COMMITTED takes a new snapshot and so sees a row
-- a concurrent call created meanwhile. Every decision is taken on the
-- locked rows, with the clock read after the last lock was taken: a call
-- that waited for another sees its write and a later instant, so the
-- instants recorded on one member's state only move forward. Nothing is
-- written unless every quota fits. Under REPEATABLE READ or SERIALIZABLE a
-- concurrent change fails the call with SQLSTATE 40001 (retried where
-- pgquota owns the transaction).
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_limits(p_quotas text[], p_member text, p_amount bigint, p_limit bigint)
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

-- The application role gets the new tables and the function (default
-- privileges cover them when this runs as the owner that ran 00010; this
-- covers a migration run as another owner).
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
-- Quotas of the new kinds cannot stay: the calendar-only check constraint
-- comes back. They are deleted with their counters, overrides and state.
DROP FUNCTION pgquota.grant_limits(text[], text, bigint, bigint);
DROP TABLE pgquota.rolling_usage;
DROP TABLE pgquota.rate_state;
DROP TABLE pgquota.quota_shape;
DELETE FROM pgquota.quota WHERE window_unit IN ('rate', 'fixed', 'rolling');
ALTER TABLE pgquota.quota DROP CONSTRAINT quota_window_unit;
ALTER TABLE pgquota.quota ADD CONSTRAINT quota_window_unit
    CHECK (window_unit IN ('none', 'hour', 'day', 'week', 'month'));
