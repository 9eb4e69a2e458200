-- Quotas of the kinds rate, fixed and rolling (migrations/00011), and
-- grants against several quotas at once.

-- name: QuotaShapeDefine :one
-- Creates or redefines a quota of kind rate, fixed or rolling with its
-- shape, in one statement (both rows or neither). As QuotaDefine, no row
-- comes back when the quota exists with another kind and replace_kind is
-- false; with replace_kind a change of kind deletes its counters.
-- The statement is pgquota.quota_shape_define (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT * FROM pgquota.quota_shape_define(@name::text, @window_unit::text, sqlc.narg('default_limit')::bigint, @period_us::bigint, sqlc.narg('burst')::bigint, @origin::timestamptz, @replace_kind::boolean);

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
-- under none: pgquota.grant_limits_row (pgquota.grant_limits of
-- migrations/00011, renamed by 00023; the public pgquota.grant_limits returns
-- its durations in milliseconds) documents the rows.
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
FROM pgquota.grant_limits_row(@quota_names::text[], @member::text, @amount::bigint, sqlc.narg('limit_value')::bigint) g
ORDER BY g.ord;
