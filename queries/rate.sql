-- Quotas of the kinds rate, fixed and rolling (migrations/00011), and
-- grants against several quotas at once.

-- name: QuotaShapeDefine :one
-- Creates or redefines a quota of kind rate, fixed or rolling with its
-- shape, in one statement (both rows or neither). As QuotaDefine, no row
-- comes back when the quota exists with another kind and replace_kind is
-- false; with replace_kind a change of kind deletes its counters.
WITH prev AS (
    SELECT p.window_unit FROM pgquota.quota p WHERE p.name = @name::text
), replaced AS (
    SELECT @replace_kind::boolean AND EXISTS (SELECT 1 FROM prev WHERE prev.window_unit <> @window_unit::text) AS yes
), gone_usage AS (
    DELETE FROM pgquota.usage u WHERE u.quota_name = @name::text AND (SELECT r.yes FROM replaced r) RETURNING 1
), gone_rate AS (
    DELETE FROM pgquota.rate_state rs WHERE rs.quota_name = @name::text AND (SELECT r.yes FROM replaced r) RETURNING 1
), gone_rolling AS (
    DELETE FROM pgquota.rolling_usage ru WHERE ru.quota_name = @name::text AND (SELECT r.yes FROM replaced r) RETURNING 1
), q AS (
    INSERT INTO pgquota.quota (name, window_unit, time_zone, default_limit)
    SELECT @name::text, @window_unit::text, 'UTC', sqlc.narg('default_limit')::bigint
    WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
    ON CONFLICT (name) DO UPDATE
    SET window_unit   = excluded.window_unit,
        time_zone     = excluded.time_zone,
        default_limit = excluded.default_limit,
        updated_at    = pgquota.clock()
    WHERE pgquota.quota.window_unit = excluded.window_unit OR @replace_kind::boolean
    RETURNING name, window_unit, time_zone, default_limit, created_at, updated_at
), s AS (
    INSERT INTO pgquota.quota_shape (quota_name, period_us, burst, origin)
    SELECT q.name, @period_us::bigint, sqlc.narg('burst')::bigint, @origin::timestamptz FROM q
    ON CONFLICT (quota_name) DO UPDATE
    SET period_us  = excluded.period_us,
        burst      = excluded.burst,
        origin     = excluded.origin,
        updated_at = pgquota.clock()
    RETURNING quota_name, period_us, burst, origin
)
SELECT q.name, q.window_unit, q.time_zone, q.default_limit, q.created_at, q.updated_at,
       s.period_us, s.burst, s.origin
FROM q JOIN s ON s.quota_name = q.name;

-- name: QuotaShapeGet :one
SELECT quota_name, period_us, burst, origin, updated_at
FROM pgquota.quota_shape
WHERE quota_name = @quota_name::text;

-- name: QuotaShapeList :many
SELECT quota_name, period_us, burst, origin, updated_at
FROM pgquota.quota_shape
ORDER BY quota_name;

-- name: QuotaKindGet :one
-- The kind (window_unit) of a quota: which grant statement serves it.
SELECT window_unit FROM pgquota.quota WHERE name = @name::text;

-- name: LimitsGrant :many
-- Grants @amount units to @member under every quota of @quota_names, or
-- under none: pgquota.grant_limits (migrations/00011) documents the rows.
SELECT g.ord::integer AS ord,
       g.quota_name::text AS quota_name,
       coalesce(g.kind, '')::text AS kind,
       g.found::boolean AS found,
       g.decided::boolean AS decided,
       (g.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(g.limit_value, 0)::bigint AS limit_value,
       coalesce(g.burst, 0)::bigint AS burst,
       coalesce(g.period_us, 0)::bigint AS period_us,
       g.fits::boolean AS fits,
       g.granted::boolean AS granted,
       g.used::bigint AS used,
       g.remaining::bigint AS remaining,
       g.window_start::timestamptz AS window_start,
       g.window_end::timestamptz AS window_end,
       g.retry_after_us::bigint AS retry_after_us,
       g.reset_after_us::bigint AS reset_after_us,
       g.decided_at::timestamptz AS decided_at
FROM pgquota.grant_limits(@quota_names::text[], @member::text, @amount::bigint, sqlc.narg('limit_value')::bigint) g
ORDER BY g.ord;
