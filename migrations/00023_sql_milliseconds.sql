-- One unit for a duration everywhere a user reads one: milliseconds, named
-- _ms, as the Go library's JSON and the CLI print them. The public SQL
-- functions pgquota.grant, pgquota.grant_keyed, pgquota.grant_limits and
-- pgquota.limit_usage return retry_after_ms, reset_after_ms,
-- refill_after_ms and period_ms (bigint) in place of the _us columns of
-- 00014, 00017 and 00021. A wait is rounded up to the next millisecond
-- (pgquota.ms_ceil), so waiting retry_after_ms is always enough; 0 stays 0
-- and -1 (no wait helps, never) stays -1. Instants stay timestamptz by the
-- database clock, at the microsecond.
--
-- Inside, pgquota keeps microseconds: the counters and the rows the Go
-- library reads (pgquota.grant_row, grant_keyed_row, limit_usage_row and,
-- renamed here from grant_limits, pgquota.grant_limits_row, which
-- grant_row and grant_limits_batch call) are unchanged, so a rate stays
-- exact (00020) and Go's time.Duration loses nothing. Those functions are
-- the library's, not a public interface (docs/sql.md).
--
-- Every function this migration creates is on the allowlist
-- (pgquota.function_grant, 00022) with the row of the function it
-- replaces, and the migration ends with pgquota.grant_roles().

-- +goose Up
CREATE FUNCTION pgquota.ms_ceil(p_us bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN p_us <= 0 THEN p_us ELSE (p_us + 999) / 1000 END $$;

ALTER FUNCTION pgquota.grant_limits(text[], text, bigint, bigint) RENAME TO grant_limits_row;

-- grant_row and grant_limits_batch call the function by name, so their
-- bodies are rewritten to call it by its new one; everything else of their
-- definitions (SECURITY DEFINER, the pinned search_path, the body) stays.
-- +goose StatementBegin
DO $$
DECLARE
    f text;
    def text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgquota.grant_row(text,text,bigint,bigint)',
                             'pgquota.grant_limits_batch(text[],integer[],integer[],text[],bigint[],bigint[])'] LOOP
        def := pg_catalog.pg_get_functiondef(f::regprocedure);
        IF strpos(def, 'pgquota.grant_limits(') = 0 THEN
            RAISE EXCEPTION 'pgquota: % does not call pgquota.grant_limits', f;
        END IF;
        EXECUTE replace(def, 'pgquota.grant_limits(', 'pgquota.grant_limits_row(');
    END LOOP;
END
$$;
-- +goose StatementEnd

INSERT INTO pgquota.function_grant (function, role, definer)
SELECT 'pgquota.grant_limits_row(text[],text,bigint,bigint)', role, definer
FROM pgquota.function_grant WHERE function = 'pgquota.grant_limits(text[],text,bigint,bigint)';

DROP FUNCTION pgquota.grant(text, text, bigint, bigint);
DROP FUNCTION pgquota.grant_keyed(text, text, text, text, bigint, bigint);
DROP FUNCTION pgquota.limit_usage(text, text);

CREATE FUNCTION pgquota.grant(p_quota text, p_member text, p_amount bigint DEFAULT 1, p_limit bigint DEFAULT NULL)
    RETURNS TABLE(found boolean, kind text, has_limit boolean, granted boolean, used bigint, limit_value bigint,
                  remaining bigint, window_start timestamptz, window_end timestamptz, retry_after_ms bigint,
                  reset_after_ms bigint, decided_at timestamptz, burst bigint, period_ms bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
    SELECT CASE WHEN g.found THEN true ELSE pgquota.quota_not_found('pgquota.grant', p_quota) END,
           g.kind, g.has_limit, g.granted, g.used, g.limit_value, g.remaining, g.window_start, g.window_end,
           pgquota.ms_ceil(g.retry_after_us), pgquota.ms_ceil(g.reset_after_us), g.decided_at, g.burst,
           pgquota.ms_ceil(g.period_us)
    FROM pgquota.grant_row(p_quota, p_member, p_amount, p_limit) g
$$;

CREATE FUNCTION pgquota.grant_keyed(p_scope text, p_key text, p_quota text, p_member text, p_amount bigint DEFAULT 1,
                                    p_limit bigint DEFAULT NULL)
    RETURNS TABLE(found boolean, kind text, has_limit boolean, limit_value bigint, window_start timestamptz,
                  window_end timestamptz, grant_id bigint, granted boolean, used bigint, prior_grant_id bigint,
                  retry_after_ms bigint, reset_after_ms bigint, decided_at timestamptz)
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
    SELECT CASE WHEN g.found OR g.prior_grant_id > 0 THEN g.found ELSE pgquota.quota_not_found('pgquota.grant_keyed', p_quota) END,
           g.kind, g.has_limit, g.limit_value, g.window_start, g.window_end, g.grant_id, g.granted, g.used,
           g.prior_grant_id, pgquota.ms_ceil(g.retry_after_us), pgquota.ms_ceil(g.reset_after_us), g.decided_at
    FROM pgquota.grant_keyed_row(p_scope, p_key, p_quota, p_member, p_amount, p_limit) g
$$;

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

-- +goose StatementBegin
CREATE FUNCTION pgquota.limit_usage(p_quota text, p_member text)
    RETURNS TABLE(kind text, limit_value bigint, burst bigint, period_ms bigint, used bigint, remaining bigint,
                  window_start timestamptz, window_end timestamptz, reset_after_ms bigint, refill_after_ms bigint,
                  read_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
BEGIN
    RETURN QUERY
        SELECT l.kind, l.limit_value, coalesce(l.burst, 0), pgquota.ms_ceil(coalesce(l.period_us, 0)), l.used,
               l.remaining, l.window_start, l.window_end, pgquota.ms_ceil(l.reset_after_us),
               pgquota.ms_ceil(l.refill_after_us), l.read_at
        FROM pgquota.limit_usage_row(p_quota, p_member) l;
    IF NOT FOUND THEN
        PERFORM pgquota.quota_not_found('pgquota.limit_usage', p_quota);
    END IF;
END
$$;
-- +goose StatementEnd

SELECT pgquota.grant_roles();

-- +goose Down
DROP FUNCTION pgquota.grant(text, text, bigint, bigint);
DROP FUNCTION pgquota.grant_keyed(text, text, text, text, bigint, bigint);
DROP FUNCTION pgquota.grant_limits(text[], text, bigint, bigint);
DROP FUNCTION pgquota.limit_usage(text, text);
DELETE FROM pgquota.function_grant WHERE function = 'pgquota.grant_limits_row(text[],text,bigint,bigint)';
ALTER FUNCTION pgquota.grant_limits_row(text[], text, bigint, bigint) RENAME TO grant_limits;

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgquota.grant_row(text,text,bigint,bigint)',
                             'pgquota.grant_limits_batch(text[],integer[],integer[],text[],bigint[],bigint[])'] LOOP
        EXECUTE replace(pg_catalog.pg_get_functiondef(f::regprocedure), 'pgquota.grant_limits_row(', 'pgquota.grant_limits(');
    END LOOP;
END
$$;
-- +goose StatementEnd

CREATE FUNCTION pgquota.grant(p_quota text, p_member text, p_amount bigint DEFAULT 1, p_limit bigint DEFAULT NULL)
    RETURNS TABLE(found boolean, kind text, has_limit boolean, granted boolean, used bigint, limit_value bigint,
                  remaining bigint, window_start timestamptz, window_end timestamptz, retry_after_us bigint,
                  reset_after_us bigint, decided_at timestamptz, burst bigint, period_us bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
    SELECT CASE WHEN g.found THEN true ELSE pgquota.quota_not_found('pgquota.grant', p_quota) END,
           g.kind, g.has_limit, g.granted, g.used, g.limit_value, g.remaining, g.window_start, g.window_end,
           g.retry_after_us, g.reset_after_us, g.decided_at, g.burst, g.period_us
    FROM pgquota.grant_row(p_quota, p_member, p_amount, p_limit) g
$$;

CREATE FUNCTION pgquota.grant_keyed(p_scope text, p_key text, p_quota text, p_member text, p_amount bigint DEFAULT 1,
                                    p_limit bigint DEFAULT NULL)
    RETURNS TABLE(found boolean, kind text, has_limit boolean, limit_value bigint, window_start timestamptz,
                  window_end timestamptz, grant_id bigint, granted boolean, used bigint, prior_grant_id bigint,
                  retry_after_us bigint, reset_after_us bigint, decided_at timestamptz)
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
    AS $$
    SELECT CASE WHEN g.found OR g.prior_grant_id > 0 THEN g.found ELSE pgquota.quota_not_found('pgquota.grant_keyed', p_quota) END,
           g.kind, g.has_limit, g.limit_value, g.window_start, g.window_end, g.grant_id, g.granted, g.used,
           g.prior_grant_id, g.retry_after_us, g.reset_after_us, g.decided_at
    FROM pgquota.grant_keyed_row(p_scope, p_key, p_quota, p_member, p_amount, p_limit) g
$$;

-- +goose StatementBegin
CREATE FUNCTION pgquota.limit_usage(p_quota text, p_member text)
    RETURNS TABLE(kind text, limit_value bigint, burst bigint, period_us bigint, used bigint, remaining bigint,
                  window_start timestamptz, window_end timestamptz, reset_after_us bigint, refill_after_us bigint,
                  read_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pgquota, pg_temp
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

DROP FUNCTION pgquota.ms_ceil(bigint);
SELECT pgquota.grant_roles();
