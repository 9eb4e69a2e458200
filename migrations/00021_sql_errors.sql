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

-- +goose Up
ALTER FUNCTION pgquota.grant(text, text, bigint, bigint) RENAME TO grant_row;
ALTER FUNCTION pgquota.grant_keyed(text, text, text, text, bigint, bigint) RENAME TO grant_keyed_row;
ALTER FUNCTION pgquota.limit_usage(text, text) RENAME TO limit_usage_row;

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
ALTER FUNCTION pgquota.limit_usage_row(text, text) RENAME TO limit_usage;
ALTER FUNCTION pgquota.grant_keyed_row(text, text, text, text, bigint, bigint) RENAME TO grant_keyed;
ALTER FUNCTION pgquota.grant_row(text, text, bigint, bigint) RENAME TO "grant";
