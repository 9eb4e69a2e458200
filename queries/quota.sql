-- name: QuotaDefine :one
-- Creates or redefines a quota. The time zone must be an IANA zone name that
-- PostgreSQL knows (pg_timezone_names, matched without regard to case); its
-- canonical spelling is stored. No row comes back, and nothing is written,
-- when the zone is unknown, or when the quota exists with another kind
-- (window_unit) and replace_kind is false. With replace_kind, a change of
-- kind deletes the quota's counters (usage) in the same statement, so that
-- none comes back when the quota is switched back; member limits stay.
-- The statement is pgquota.quota_define (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT * FROM pgquota.quota_define(@name::text, @window_unit::text, sqlc.narg('default_limit')::bigint, @time_zone::text, @replace_kind::boolean);

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
