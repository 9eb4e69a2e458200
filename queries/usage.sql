-- Durable commits: every statement here that changes state raises its
-- transaction's synchronous_commit from off to on (set_config(..., true),
-- read at commit; the WHERE clause of its final SELECT), so a grant that
-- reported success survives a crash even where a role or database runs
-- with synchronous_commit = off (the PostgreSQL manual, 30.4): a lost grant
-- would leave the counter below the units handed out. The same line stands
-- in the other files' grant, revoke, claim, outbox and definition
-- statements; pgquota.durable_commit() in 00007 does the same for leases.
-- Built-in functions only, so these statements need no newer migration.

-- name: UsageGrant :one
-- Grants @amount units of a quota to a member in the window that holds the
-- database clock's current instant, in ONE statement (one round trip, also
-- for a member's first grant of a window).
--
-- The limit is the call's, else the member's override, else the quota's
-- default. Every guard is in the WHERE clause of the row being written:
--   * an existing counter is raised by a plain UPDATE whose WHERE holds
--     used + amount <= limit. Under READ COMMITTED, when a concurrent grant
--     changed the row, PostgreSQL waits for it, then re-checks the WHERE
--     clause against the newest committed version (the manual's
--     "EvalPlanQual" rule, section 13.2.1), so the limit holds;
--   * a counter missing from the statement's snapshot is inserted; when a
--     concurrent first grant inserted it meanwhile, ON CONFLICT DO UPDATE
--     locks that row and its WHERE re-checks the guard on the newest version.
-- A guard that does not fire writes nothing and returns no counter row: that
-- is a denial. The limit and the window come from sub-selects, which read
-- the statement's snapshot; they are inputs to the guard, never the guard.
--
-- Exactly one row comes back when the quota exists, none when it does not.
-- has_limit is false (and nothing was written) when no limit was found.
-- On a denial, used is read again with a fresh snapshot so that it includes
-- the grant that won the race.
WITH def AS (
    SELECT q.name,
           coalesce(sqlc.narg('limit_value')::bigint, o.limit_value, q.default_limit) AS limit_value,
           pgquota.window_start(q.window_unit, q.time_zone, c.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, c.at) AS window_end,
           c.at
    FROM pgquota.quota q
    CROSS JOIN (SELECT pgquota.clock() AS at) c
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = @member::text
    WHERE q.name = @quota_name::text
), upd AS (
    UPDATE pgquota.usage u
    SET used = u.used + @amount::bigint,
        updated_at = def.at
    FROM def
    WHERE u.quota_name = def.name
      AND u.member = @member::text
      AND u.window_start = def.window_start
      AND u.window_end = def.window_end
      AND u.used + @amount::bigint <= def.limit_value
    RETURNING u.used
), ins AS (
    INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
    SELECT def.name, @member::text, def.window_start, def.window_end, @amount::bigint, def.at
    FROM def
    WHERE @amount::bigint <= def.limit_value
      AND NOT EXISTS (
          SELECT 1 FROM pgquota.usage x
          WHERE x.quota_name = def.name
            AND x.member = @member::text
            AND x.window_start = def.window_start
            AND x.window_end = def.window_end
      )
    ON CONFLICT (quota_name, member, window_start, window_end) DO UPDATE
    SET used = u.used + excluded.used,
        updated_at = excluded.updated_at
    WHERE u.used + excluded.used <= (SELECT def.limit_value FROM def)
    RETURNING u.used
), granted AS (
    SELECT upd.used FROM upd
    UNION ALL
    SELECT ins.used FROM ins
)
SELECT (def.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(def.limit_value, 0)::bigint AS limit_value,
       def.window_start::timestamptz AS window_start,
       def.window_end::timestamptz AS window_end,
       (g.used IS NOT NULL)::boolean AS granted,
       coalesce(g.used, pgquota.usage_used_fresh(def.name, @member::text, def.window_start, def.window_end))::bigint AS used
FROM def
LEFT JOIN granted g ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: UsageRevoke :one
-- Gives back up to @amount units of a member's counter in the current
-- window, never below zero. The counter row is locked first (a locking read
-- returns the newest committed version), so used_before and used_after
-- describe the same row version and revoked = used_before - used_after.
WITH def AS (
    SELECT q.name,
           pgquota.window_start(q.window_unit, q.time_zone, c.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, c.at) AS window_end,
           c.at
    FROM pgquota.quota q
    CROSS JOIN (SELECT pgquota.clock() AS at) c
    WHERE q.name = @quota_name::text
), cur AS (
    SELECT u.quota_name, u.member, u.window_start, u.window_end, u.used
    FROM pgquota.usage u
    JOIN def ON u.quota_name = def.name
            AND u.window_start = def.window_start
            AND u.window_end = def.window_end
    WHERE u.member = @member::text
    FOR UPDATE OF u
), upd AS (
    UPDATE pgquota.usage u
    SET used = u.used - least(u.used, @amount::bigint),
        updated_at = def.at
    FROM def, cur
    WHERE u.quota_name = cur.quota_name
      AND u.member = cur.member
      AND u.window_start = cur.window_start
      AND u.window_end = cur.window_end
    RETURNING u.used
)
SELECT def.window_start::timestamptz AS window_start,
       def.window_end::timestamptz AS window_end,
       coalesce((SELECT cur.used FROM cur), 0)::bigint AS used_before,
       coalesce((SELECT upd.used FROM upd), 0)::bigint AS used_after
FROM def
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: UsageGet :one
-- Reads a member's state under a quota of any kind, and the limit that
-- applies to it (the member's override, else the quota's default), writing
-- nothing: pgquota.limit_usage (migrations/00017) documents the figures.
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
FROM pgquota.limit_usage(@quota_name::text, @member::text) l;
