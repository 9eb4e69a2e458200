-- name: QuotaDefine :one
-- Creates or redefines a quota. The time zone must be an IANA zone name that
-- PostgreSQL knows (pg_timezone_names, matched without regard to case); its
-- canonical spelling is stored. No row comes back, and nothing is written,
-- when the zone is unknown, or when the quota exists with another kind
-- (window_unit) and replace_kind is false. With replace_kind, a change of
-- kind deletes the quota's counters (usage) in the same statement, so that
-- none comes back when the quota is switched back; member limits stay. (A
-- rate's or rolling window's state, which only QuotaShapeDefine's kinds
-- read, is deleted by QuotaShapeDefine when the quota becomes one again;
-- this statement names only migration 00001's tables, so it runs on any
-- schema.) prev reads the row
-- as the statement's snapshot saw it (no FOR UPDATE: the upsert below may
-- run first, and a row it updated is invisible to a locking read).
WITH prev AS (
    SELECT p.window_unit FROM pgquota.quota p WHERE p.name = @name::text
), replaced AS (
    SELECT @replace_kind::boolean AND EXISTS (SELECT 1 FROM prev WHERE prev.window_unit <> @window_unit::text) AS yes
), gone_usage AS (
    DELETE FROM pgquota.usage u WHERE u.quota_name = @name::text AND (SELECT r.yes FROM replaced r) RETURNING 1
)
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
WHERE pgquota.quota.window_unit = excluded.window_unit OR @replace_kind::boolean
RETURNING name, window_unit, time_zone, default_limit, created_at, updated_at;

-- name: QuotaGet :one
SELECT name, window_unit, time_zone, default_limit, created_at, updated_at
FROM pgquota.quota
WHERE name = @name::text;

-- name: QuotaList :many
SELECT name, window_unit, time_zone, default_limit, created_at, updated_at
FROM pgquota.quota
ORDER BY name;

-- name: QuotaTimeZoneKnown :one
-- Whether PostgreSQL knows the IANA zone (as QuotaDefine matches it): tells
-- an unknown zone from a refused change of kind when QuotaDefine returned
-- no row.
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_timezone_names z WHERE lower(z.name) = lower(@time_zone::text)
)::boolean AS known;
