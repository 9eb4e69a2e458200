-- SQL callers learn of an unknown quota from an error, not from a row that
-- reads as a denial: pgquota.grant, pgquota.grant_keyed and
-- pgquota.limit_usage raise SQLSTATE PQ010 (quota not found, class PQ of
-- pgquota's own errors: see 00003_lease.sql for PQ001 and PQ002, 00006 for
-- PQ003), naming the function and the quota. Before, pgquota.grant and
-- grant_keyed returned one row with found = false and granted = false (a
-- caller that did not check found read a denial), and limit_usage no row.
-- A keyed call whose key was taken before still replays (prior_grant_id),
-- whether or not the quota exists now. Nothing is written in either case.
--
-- pgquota.limit_usage now returns burst and period_us 0 for the kinds that
-- have none (the calendar kinds; burst for every kind but rate), as
-- pgquota.grant does, instead of NULL.
--
-- The row-returning versions stay, renamed, for pgquota's Go library
-- (queries/usage.sql, queries/ledger.sql): pgquota.grant_row,
-- pgquota.grant_keyed_row and pgquota.limit_usage_row keep the contract of
-- 00014 and 00017 (found = false; no row), so that GrantTx and a keyed
-- GrantBatch can report ErrQuotaNotFound without an error that would abort
-- the caller's transaction. The public functions wrap them, so whatever
-- 00020 (or a later migration) decides inside stays in one place.

-- pgquota.limit_usage_row cuts fixed windows and computes a rate's figures
-- with 00020's exact integer division (pgquota.floor_div, ceil_div), as
-- pgquota.grant_limits does, so that Usage and the next grant agree at
-- every instant: 00017's rounded division put the last microsecond of a
-- long fixed window (100 years) in the next window, and a rate whose
-- period does not divide evenly a unit short at an exact refill instant.

-- +goose Up
ALTER FUNCTION pgquota.grant(text, text, bigint, bigint) RENAME TO grant_row;
ALTER FUNCTION pgquota.grant_keyed(text, text, text, text, bigint, bigint) RENAME TO grant_keyed_row;
ALTER FUNCTION pgquota.limit_usage(text, text) RENAME TO limit_usage_row;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.limit_usage_row(p_quota text, p_member text)
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
            window_start := r.ori + (pgquota.floor_div((extract(epoch FROM v_now) - extract(epoch FROM r.ori)) * 1000000, r.per)
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
        -- Exactly, as grant_limits (00020) computes it: in units of 1/limit
        -- microsecond, where the emission interval is the period, the TAT
        -- rounded to a whole unit, floors and ceilings integer divisions.
        v_tat := round(coalesce((SELECT s.tat_us FROM pgquota.rate_state s
                                 WHERE s.quota_name = p_quota AND s.member = p_member), 0) * r.lim);
        v_t := r.per;
        v_tat := greatest(v_tat, v_now_us * r.lim);
        remaining := least(burst, greatest(0, pgquota.floor_div(v_now_us * r.lim - (v_tat - burst * v_t), v_t)))::bigint;
        used := burst - remaining;
        reset_after_us := least(pgquota.ceil_div(v_tat - v_now_us * r.lim, r.lim), 9223372036854775807)::bigint;
        refill_after_us := CASE WHEN remaining >= burst THEN 0
                                ELSE least(greatest(pgquota.ceil_div(v_tat - (burst - remaining - 1) * v_t - v_now_us * r.lim, r.lim), 0),
                                           9223372036854775807)::bigint END;
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

-- pgquota.quota_not_found raises PQ010 for p_quota in function p_fn. It
-- returns boolean so that it can stand in an expression.
-- +goose StatementBegin
CREATE FUNCTION pgquota.quota_not_found(p_fn text, p_quota text)
RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PQ010',
        MESSAGE = format('%s: quota %s does not exist', p_fn, quote_literal(p_quota)),
        HINT = 'define it first (pgquota quota define, or Client.DefineQuota)';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgquota.grant(p_quota text, p_member text, p_amount bigint DEFAULT 1, p_limit bigint DEFAULT NULL)
RETURNS TABLE (
    found boolean, kind text, has_limit boolean, granted boolean, used bigint, limit_value bigint,
    remaining bigint, window_start timestamptz, window_end timestamptz,
    retry_after_us bigint, reset_after_us bigint, decided_at timestamptz,
    burst bigint, period_us bigint
)
    LANGUAGE sql VOLATILE
    AS $$
    SELECT CASE WHEN g.found THEN true ELSE pgquota.quota_not_found('pgquota.grant', p_quota) END,
           g.kind, g.has_limit, g.granted, g.used, g.limit_value, g.remaining, g.window_start, g.window_end,
           g.retry_after_us, g.reset_after_us, g.decided_at, g.burst, g.period_us
    FROM pgquota.grant_row(p_quota, p_member, p_amount, p_limit) g
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_keyed(
    p_scope text, p_key text, p_quota text, p_member text, p_amount bigint DEFAULT 1, p_limit bigint DEFAULT NULL
)
RETURNS TABLE (
    found boolean, kind text, has_limit boolean, limit_value bigint,
    window_start timestamptz, window_end timestamptz, grant_id bigint, granted boolean, used bigint,
    prior_grant_id bigint, retry_after_us bigint, reset_after_us bigint, decided_at timestamptz
)
    LANGUAGE sql VOLATILE
    AS $$
    SELECT CASE WHEN g.found OR g.prior_grant_id > 0 THEN g.found ELSE pgquota.quota_not_found('pgquota.grant_keyed', p_quota) END,
           g.kind, g.has_limit, g.limit_value, g.window_start, g.window_end, g.grant_id, g.granted, g.used,
           g.prior_grant_id, g.retry_after_us, g.reset_after_us, g.decided_at
    FROM pgquota.grant_keyed_row(p_scope, p_key, p_quota, p_member, p_amount, p_limit) g
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgquota.limit_usage(p_quota text, p_member text)
RETURNS TABLE (
    kind text, limit_value bigint, burst bigint, period_us bigint,
    used bigint, remaining bigint, window_start timestamptz, window_end timestamptz,
    reset_after_us bigint, refill_after_us bigint, read_at timestamptz
)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN QUERY
        SELECT l.kind, l.limit_value, coalesce(l.burst, 0), coalesce(l.period_us, 0), l.used, l.remaining,
               l.window_start, l.window_end, l.reset_after_us, l.refill_after_us, l.read_at
        FROM pgquota.limit_usage_row(p_quota, p_member) l;
    IF NOT FOUND THEN
        PERFORM pgquota.quota_not_found('pgquota.limit_usage', p_quota);
    END IF;
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

-- +goose Down
DROP FUNCTION pgquota.limit_usage(text, text);
DROP FUNCTION pgquota.grant_keyed(text, text, text, text, bigint, bigint);
DROP FUNCTION pgquota.grant(text, text, bigint, bigint);
DROP FUNCTION pgquota.quota_not_found(text, text);
-- 00017's limit_usage, as it was.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.limit_usage_row(p_quota text, p_member text)
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
ALTER FUNCTION pgquota.limit_usage_row(text, text) RENAME TO limit_usage;
ALTER FUNCTION pgquota.grant_keyed_row(text, text, text, text, bigint, bigint) RENAME TO grant_keyed;
ALTER FUNCTION pgquota.grant_row(text, text, bigint, bigint) RENAME TO "grant";
