-- Durable commits: the grant and revoke functions these statements call
-- (migrations/00014) raise their transaction's synchronous_commit from off
-- to on (pgquota.durable_commit(), 00007; read at commit), so a grant that
-- reported success survives a crash even where a role or database runs
-- with synchronous_commit = off (the PostgreSQL manual, 30.4): a lost grant
-- would leave the counter below the units handed out. The other files'
-- writing statements do the same with set_config(..., true) in the WHERE
-- clause of their final SELECT.

-- name: UsageGrant :one
-- Grants @amount units of a quota of any kind to a member, in ONE statement
-- (one round trip, also for a member's first grant of a window):
-- pgquota.grant (migrations/00014, docs/sql.md) holds the logic, the guard
-- in the WHERE clause of the counter row being written and why the limit
-- holds under READ COMMITTED. Exactly one row comes back: found is false
-- when the quota does not exist, has_limit false when no limit applies,
-- decided_at NULL when nothing was decided (nothing written then).
SELECT g.found::boolean AS found,
       coalesce(g.kind, '')::text AS kind,
       g.has_limit::boolean AS has_limit,
       g.granted::boolean AS granted,
       g.used::bigint AS used,
       g.limit_value::bigint AS limit_value,
       g.remaining::bigint AS remaining,
       g.window_start::timestamptz AS window_start,
       g.window_end::timestamptz AS window_end,
       g.retry_after_us::bigint AS retry_after_us,
       g.reset_after_us::bigint AS reset_after_us,
       g.decided_at::timestamptz AS decided_at,
       g.burst::bigint AS burst,
       g.period_us::bigint AS period_us
FROM pgquota.grant_row(@quota_name::text, @member::text, @amount::bigint, sqlc.narg('limit_value')::bigint) g;

-- name: UsageRevoke :one
-- Gives back up to @amount units of a member's counter in the current
-- window, never below zero: pgquota.revoke (migrations/00014). found is
-- false when the quota does not exist; kind says which it is (a quota of
-- kind rate, fixed or rolling is refused: nothing written).
SELECT r.found::boolean AS found,
       coalesce(r.kind, '')::text AS kind,
       r.window_start::timestamptz AS window_start,
       r.window_end::timestamptz AS window_end,
       r.used_before::bigint AS used_before,
       r.used_after::bigint AS used_after
FROM pgquota.revoke(@quota_name::text, @member::text, @amount::bigint) r;

-- name: UsageGet :one
-- Reads a member's state under a quota of any kind, and the limit that
-- applies to it (the member's override, else the quota's default), writing
-- nothing: pgquota.limit_usage_row (migrations/00017 and 00021; the
-- public pgquota.limit_usage wraps it, in milliseconds) documents the figures.
-- No row when the quota does not exist.
SELECT coalesce(l.kind, '')::text AS kind,
       (l.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(l.limit_value, 0)::bigint AS limit_value,
       coalesce(l.burst, 0)::bigint AS burst,
       coalesce(l.period_us, 0)::bigint AS period_us,
       l.used::bigint AS used,
       l.remaining::bigint AS remaining,
       l.window_start::timestamptz AS window_start,
       l.window_end::timestamptz AS window_end,
       l.reset_after_us::bigint AS reset_after_us,
       l.refill_after_us::bigint AS refill_after_us,
       l.read_at::timestamptz AS read_at
FROM pgquota.limit_usage_row(@quota_name::text, @member::text) l;
