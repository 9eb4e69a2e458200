-- Usage for every kind of quota: pgquota.limit_usage reads a member's state
-- under one quota, calendar, fixed, rate or rolling, and writes nothing
-- (queries/usage.sql, UsageGet, runs it; Client.Usage and `pgquota usage`).
--
-- The figures are those pgquota.grant_limits (00011) computes for the same
-- state and instant, with the same expressions, taken from its branches
-- that leave the state as it is (a denial):
--   * calendar and fixed windows: the counter of the window holding the
--     clock's instant (fixed windows cut at origin + k * period_us, as in
--     grant_limits' locking loop); reset_after_us the wait until the window
--     ends (-1 for a lifetime counter, 'none');
--   * rate: remaining = least(burst, greatest(0, floor((now - (max(tat,
--     now) - burst*T)) / T))) with T = period_us / limit, used = burst -
--     remaining, reset_after_us = ceil(max(tat, now) - now) (the bucket is
--     full again); a limit of 0: remaining 0, reset_after_us -1;
--   * rolling: used = the units of the kept grants newer than now - period
--     (the filter grant_limits applies before deciding), reset_after_us =
--     the wait until the newest of them leaves (stamp + period - now).
-- refill_after_us is the one figure grant_limits has no counterpart for:
-- the wait until remaining next grows (0 when nothing is in use): the
-- window's end for a counter, when the oldest kept grant leaves a rolling
-- window, and for a rate the instant the next whole unit is emitted,
-- tat - (burst - remaining - 1) * T (-1 for a rate of limit 0).
--
-- Waits are rounded up to whole microseconds, as in grant_limits. The
-- instant is pgquota.clock() read once, without locks: a concurrent grant
-- that has not committed is not seen, so the figures are those of the
-- committed state at read_at, which the next grant may already have moved.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION pgquota.limit_usage(p_quota text, p_member text)
RETURNS TABLE (
    kind text, limit_value bigint, burst bigint, period_us bigint,
    used bigint, remaining bigint, window_start timestamptz, window_end timestamptz,
    reset_after_us bigint, refill_after_us bigint, read_at timestamptz
)
    LANGUAGE plpgsql STABLE
    AS $$
#variable_conflict use_variable
DECLARE
    r        record;
    v_now    timestamptz := pgquota.clock();
    v_now_us numeric := extract(epoch FROM v_now) * 1000000;
    v_t      numeric;
    v_tat    numeric;
    v_st     timestamptz[];
    v_un     bigint[];
    v_first  timestamptz;
    v_last   timestamptz;
    j        integer;
BEGIN
    IF p_quota IS NULL OR octet_length(p_quota) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgquota.limit_usage: p_quota must be 1 to 255 bytes, got %',
            coalesce(octet_length(p_quota) || ' bytes', 'NULL') USING ERRCODE = '22023';
    ELSIF p_member IS NULL OR octet_length(p_member) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgquota.limit_usage: p_member must be 1 to 255 bytes, got %',
            coalesce(octet_length(p_member) || ' bytes', 'NULL') USING ERRCODE = '22023';
    END IF;
    SELECT q.window_unit, q.time_zone,
           coalesce(o.limit_value, q.default_limit) AS lim,
           s.period_us AS per, s.burst AS bur, s.origin AS ori
    INTO r
    FROM pgquota.quota q
    LEFT JOIN pgquota.quota_shape s ON s.quota_name = q.name
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = p_member
    WHERE q.name = p_quota;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    kind := r.window_unit;
    limit_value := r.lim;
    period_us := r.per;
    burst := CASE WHEN r.window_unit = 'rate' THEN coalesce(r.bur, r.lim) END;
    used := 0;
    remaining := 0;
    reset_after_us := 0;
    refill_after_us := 0;
    read_at := v_now;

    IF kind IN ('none', 'hour', 'day', 'week', 'month', 'fixed') THEN
        IF kind = 'fixed' THEN
            window_start := r.ori + (floor((extract(epoch FROM v_now) - extract(epoch FROM r.ori)) * 1000000 / r.per)
                                     * r.per) * interval '1 microsecond';
            window_end := window_start + r.per * interval '1 microsecond';
        ELSE
            window_start := pgquota.window_start(kind, r.time_zone, v_now);
            window_end := pgquota.window_end(kind, r.time_zone, v_now);
        END IF;
        used := coalesce((SELECT u.used FROM pgquota.usage u
                          WHERE u.quota_name = p_quota AND u.member = p_member
                            AND u.window_start = window_start AND u.window_end = window_end), 0);
        remaining := greatest(coalesce(r.lim, 0) - used, 0);
        reset_after_us := CASE WHEN kind = 'none' THEN -1
                               ELSE ceil(extract(epoch FROM (window_end - v_now)) * 1000000)::bigint END;
        refill_after_us := CASE WHEN used = 0 THEN 0 ELSE reset_after_us END;
    ELSIF kind = 'rate' AND r.lim = 0 THEN
        -- limit 0 grants nothing (grant_limits' first rate branch).
        used := burst;
        reset_after_us := -1;
        refill_after_us := -1;
    ELSIF kind = 'rate' AND r.lim IS NOT NULL THEN
        v_tat := coalesce((SELECT s.tat_us FROM pgquota.rate_state s
                           WHERE s.quota_name = p_quota AND s.member = p_member), 0);
        v_t := r.per::numeric / r.lim;
        v_tat := greatest(v_tat, v_now_us);
        remaining := least(burst, greatest(0, floor((v_now_us - (v_tat - burst * v_t)) / v_t)))::bigint;
        used := burst - remaining;
        reset_after_us := least(ceil(v_tat - v_now_us), 9223372036854775807)::bigint;
        refill_after_us := CASE WHEN remaining >= burst THEN 0
                                ELSE least(greatest(ceil(v_tat - (burst - remaining - 1) * v_t - v_now_us), 0), 9223372036854775807)::bigint END;
    ELSIF kind = 'rolling' THEN
        SELECT s.stamps, s.units INTO v_st, v_un FROM pgquota.rolling_usage s
        WHERE s.quota_name = p_quota AND s.member = p_member;
        FOR j IN 1 .. coalesce(cardinality(v_st), 0) LOOP
            IF v_st[j] > v_now - r.per * interval '1 microsecond' THEN
                used := used + v_un[j];
                v_first := coalesce(v_first, v_st[j]);
                v_last := v_st[j];
            END IF;
        END LOOP;
        remaining := greatest(coalesce(r.lim, 0) - used, 0);
        IF v_last IS NOT NULL THEN
            reset_after_us := greatest(ceil(extract(epoch FROM (v_last - v_now)) * 1000000 + r.per), 0)::bigint;
            refill_after_us := greatest(ceil(extract(epoch FROM (v_first - v_now)) * 1000000 + r.per), 0)::bigint;
        END IF;
    END IF;
    IF kind IN ('rate', 'rolling') THEN
        window_start := NULL;
        window_end := NULL;
    END IF;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- The application role gets the function (default privileges cover it when
-- this runs as the owner that ran 00010; this covers another owner).
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
DROP FUNCTION pgquota.limit_usage(text, text);
