-- name: QuotaDefine :one
-- Creates or redefines a quota. The time zone must be an IANA zone name that
-- PostgreSQL knows (pg_timezone_names, matched without regard to case); its
-- canonical spelling is stored. No row comes back, and nothing is written,
-- when the zone is unknown.
INSERT INTO pgquota.quota (name, window_unit, time_zone, default_limit)
SELECT @name::text, @window_unit::text, tz.name, sqlc.narg('default_limit')::bigint
FROM (
    SELECT z.name FROM pg_catalog.pg_timezone_names z
    WHERE lower(z.name) = lower(@time_zone::text)
    ORDER BY z.name = @time_zone::text DESC, z.name
    LIMIT 1
) tz
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
ON CONFLICT (name) DO UPDATE
SET window_unit   = excluded.window_unit,
    time_zone     = excluded.time_zone,
    default_limit = excluded.default_limit,
    updated_at    = pgquota.clock()
RETURNING name, window_unit, time_zone, default_limit, created_at, updated_at;

-- name: QuotaGet :one
SELECT name, window_unit, time_zone, default_limit, created_at, updated_at
FROM pgquota.quota
WHERE name = @name::text;

-- name: QuotaList :many
SELECT name, window_unit, time_zone, default_limit, created_at, updated_at
FROM pgquota.quota
ORDER BY name;
