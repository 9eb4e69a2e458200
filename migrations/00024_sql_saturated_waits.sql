-- Two corrections to the public SQL functions of 00023 (docs/sql.md).
--
-- 1. pgquota.ms_ceil rounded up as (us + 999) / 1000 in bigint, which
--    overflows past 2^63 - 1000 us. The library's row functions saturate
--    a wait that does not fit at 2^63 - 1 us on purpose (00011, 00017: a
--    rate of one unit a century with a large burst), so pgquota.grant,
--    grant_limits and limit_usage failed with 22003 (bigint out of range)
--    for a call the Go library grants. Now it divides first and adds one
--    for a remainder: exact for every bigint, 2^63 - 1 us giving
--    9223372036854776 ms.
-- 2. pgquota.grant_limits answered a quota that does not exist, or a NULL
--    name, with a row found = false (and granted = false), where every
--    other public function raises PQ010: a caller reading only granted
--    took it for a denial. Now it raises PQ010 naming the quota (nothing
--    is written: the statement fails), and 22023 for a NULL or empty array
--    or a NULL element.
--
-- CREATE OR REPLACE keeps each function's privileges; grant_limits keeps
-- SECURITY DEFINER and its pinned search_path, written again below, and
-- its allowlist row (00023).

-- +goose Up

CREATE OR REPLACE FUNCTION pgquota.ms_ceil(p_us bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN p_us <= 0 THEN p_us ELSE p_us / 1000 + CASE WHEN p_us % 1000 > 0 THEN 1 ELSE 0 END END $$;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_limits(p_quotas text[], p_member text, p_amount bigint, p_limit bigint)
    RETURNS TABLE(ord integer, quota_name text, kind text, found boolean, decided boolean, limit_value bigint,
                  burst bigint, period_ms bigint, fits boolean, granted boolean, used bigint, remaining bigint,
                  window_start timestamptz, window_end timestamptz, retry_after_ms bigint, reset_after_ms bigint,
                  decided_at timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $fn$
BEGIN
    IF p_quotas IS NULL OR cardinality(p_quotas) = 0 OR array_position(p_quotas, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pgquota.grant_limits: p_quotas must name one quota or more, none of them NULL';
    END IF;
    RETURN QUERY
    SELECT g.ord, g.quota_name, g.kind,
           CASE WHEN g.found THEN true ELSE pgquota.quota_not_found('pgquota.grant_limits', g.quota_name) END,
           g.decided, g.limit_value, g.burst, pgquota.ms_ceil(g.period_us),
           g.fits, g.granted, g.used, g.remaining, g.window_start, g.window_end,
           pgquota.ms_ceil(g.retry_after_us), pgquota.ms_ceil(g.reset_after_us), g.decided_at
    FROM pgquota.grant_limits_row(p_quotas, p_member, p_amount, p_limit) g;
END
$fn$;
-- +goose StatementEnd

SELECT pgquota.grant_roles();

-- +goose Down

CREATE OR REPLACE FUNCTION pgquota.ms_ceil(p_us bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN p_us <= 0 THEN p_us ELSE (p_us + 999) / 1000 END $$;

DROP FUNCTION pgquota.grant_limits(text[], text, bigint, bigint);
CREATE FUNCTION pgquota.grant_limits(p_quotas text[], p_member text, p_amount bigint, p_limit bigint)
    RETURNS TABLE(ord integer, quota_name text, kind text, found boolean, decided boolean, limit_value bigint,
                  burst bigint, period_ms bigint, fits boolean, granted boolean, used bigint, remaining bigint,
                  window_start timestamptz, window_end timestamptz, retry_after_ms bigint, reset_after_ms bigint,
                  decided_at timestamptz)
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
    SELECT g.ord, g.quota_name, g.kind, g.found, g.decided, g.limit_value, g.burst, pgquota.ms_ceil(g.period_us),
           g.fits, g.granted, g.used, g.remaining, g.window_start, g.window_end,
           pgquota.ms_ceil(g.retry_after_us), pgquota.ms_ceil(g.reset_after_us), g.decided_at
    FROM pgquota.grant_limits_row(p_quotas, p_member, p_amount, p_limit) g
$$;


SELECT pgquota.grant_roles();
