-- name: UsageGrantBatch :many
-- Grants a batch of requests, in ONE statement (one round trip, one
-- commit when it runs on its own). The requests come grouped by counter:
-- counter i is quota @quota_names[i] of member @members[i] (each pair at
-- most once), and its requests are elements @firsts[i] .. @firsts[i] +
-- @counts[i] - 1 of @amounts (units asked for) and @limit_values (the
-- call's limit, or -1 for none: the member's override, else the quota's
-- default applies). A counter's requests are decided one after another in
-- array order, exactly as if each had been a UsageGrant (usage.sql) run in
-- that order: see pgquota.greedy_take.
--
-- The result holds, in no particular order, one row of kind 'counter' per
-- counter (quota, member) whose quota exists, and one row of kind
-- 'updated' or 'inserted' per counter this statement wrote. The caller
-- merges them by (quota_name, member) and replays each request's outcome
-- (quota/batch.go):
--   'counter':  implicit_limit is the limit of requests that gave none (the
--               member's override, else the quota's default;
--               has_implicit_limit false when there is none), the window is
--               the one that holds the database clock's instant (read once
--               for the whole statement), snapshot_used the counter in this
--               statement's snapshot (has_row false when it had none), and
--               used_after the counter read with a fresh snapshot when the
--               snapshot already had no room for any request (a sure denial,
--               reported as UsageGrant reports one), else 0;
--   'updated':  the counter was raised from used_before to used_after;
--   'inserted': the counter was created with used_after units.
-- A counter that was neither updated nor inserted although its snapshot
-- value had room was passed over because a concurrent transaction changed
-- it after this statement's snapshot was taken: it created the row (ON
-- CONFLICT DO NOTHING), or took the room (the locking read's re-check
-- failed). Nothing was written for it; the caller runs its requests again,
-- and the next statement's snapshot sees that transaction's work.
--
-- Why it is exact (every guard on the row being written, under READ
-- COMMITTED, the PostgreSQL manual, section 13.2.1):
--   * cur locks each existing counter that has room for at least one
--     request. A locking read that finds the row changed by a concurrent
--     transaction waits for it, then re-checks its WHERE clause against
--     the newest committed version and returns that version; so used is
--     the counter's current value and stays so while this transaction
--     holds the lock. Counters are locked in key order, so two batches
--     cannot deadlock on each other's counters.
--   * upd raises exactly the counters cur locked, by greedy_take of the
--     row's own (newest) value, and only where that value is the one cur
--     returned (u.used = c.used): used_before and used_after describe the
--     same row version, and the per-request replay from used_before is the
--     one the database applied.
--   * ins creates the counters missing from the snapshot with
--     greedy_take(0, ...), in key order. When a concurrent transaction
--     inserted one meanwhile, ON CONFLICT DO NOTHING writes nothing: its
--     value could not be read back from an ON CONFLICT DO UPDATE before
--     PostgreSQL 18 (RETURNING old), and the replay needs it.
-- A counter whose snapshot value already has no room is not locked at all,
-- like UsageGrant's plain UPDATE whose WHERE clause fails.
--
-- The result is a UNION ALL of the three kinds rather than a join of the
-- CTEs: CTE scans carry no statistics, and joined with each other they can
-- be planned as nested loops, quadratic in the batch size.
WITH grp AS (
    -- Set-returning functions in one select list run in lockstep: row i
    -- holds element i of each array.
    SELECT unnest(@quota_names::text[]) AS quota_name,
           unnest(@members::text[]) AS member,
           unnest(@firsts::integer[]) AS first,
           unnest(@counts::integer[]) AS n
), clk AS (
    SELECT pgquota.clock() AS at
), qdef AS (
    SELECT q.name, q.default_limit,
           pgquota.window_start(q.window_unit, q.time_zone, clk.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, clk.at) AS window_end,
           clk.at
    FROM pgquota.quota q
    CROSS JOIN clk
    WHERE q.name IN (SELECT g.quota_name FROM grp g)
), gdef AS (
    SELECT g.quota_name, g.member,
           (@amounts::bigint[])[g.first : g.first + g.n - 1] AS amounts,
           (@limit_values::bigint[])[g.first : g.first + g.n - 1] AS limits,
           coalesce(o.limit_value, q.default_limit) AS implicit_limit,
           q.window_start, q.window_end, q.at
    FROM grp g
    JOIN qdef q ON q.name = g.quota_name
    LEFT JOIN pgquota.quota_override o ON o.quota_name = g.quota_name AND o.member = g.member
), cur AS (
    SELECT u.quota_name, u.member, u.window_start, u.window_end, u.used,
           g.amounts, g.limits, g.implicit_limit, g.at
    FROM gdef g
    JOIN pgquota.usage u ON u.quota_name = g.quota_name
                        AND u.member = g.member
                        AND u.window_start = g.window_start
                        AND u.window_end = g.window_end
    WHERE pgquota.greedy_take(u.used, g.amounts, g.limits, g.implicit_limit) > 0
    ORDER BY u.quota_name, u.member, u.window_start, u.window_end
    FOR NO KEY UPDATE OF u
), upd AS (
    UPDATE pgquota.usage u
    SET used = u.used + pgquota.greedy_take(u.used, c.amounts, c.limits, c.implicit_limit),
        updated_at = c.at
    FROM cur c
    WHERE u.quota_name = c.quota_name
      AND u.member = c.member
      AND u.window_start = c.window_start
      AND u.window_end = c.window_end
      AND u.used = c.used
    RETURNING u.quota_name, u.member, c.used AS used_before, u.used AS used_after
), ins AS (
    INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
    SELECT g.quota_name, g.member, g.window_start, g.window_end,
           pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit), g.at
    FROM gdef g
    WHERE pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0
      AND NOT EXISTS (
          SELECT 1 FROM pgquota.usage x
          WHERE x.quota_name = g.quota_name
            AND x.member = g.member
            AND x.window_start = g.window_start
            AND x.window_end = g.window_end
      )
    ORDER BY g.quota_name, g.member
    ON CONFLICT (quota_name, member, window_start, window_end) DO NOTHING
    RETURNING u.quota_name, u.member, u.used
)
SELECT 'counter'::text AS kind,
       g.quota_name::text AS quota_name,
       g.member::text AS member,
       (g.implicit_limit IS NOT NULL)::boolean AS has_implicit_limit,
       coalesce(g.implicit_limit, 0)::bigint AS implicit_limit,
       g.window_start::timestamptz AS window_start,
       g.window_end::timestamptz AS window_end,
       (u.used IS NOT NULL)::boolean AS has_row,
       coalesce(u.used, 0)::bigint AS snapshot_used,
       0::bigint AS used_before,
       (CASE WHEN pgquota.greedy_take(coalesce(u.used, 0), g.amounts, g.limits, g.implicit_limit) = 0
             THEN pgquota.usage_used_fresh(g.quota_name, g.member, g.window_start, g.window_end)
             ELSE 0 END)::bigint AS used_after
FROM gdef g
LEFT JOIN pgquota.usage u ON u.quota_name = g.quota_name
                         AND u.member = g.member
                         AND u.window_start = g.window_start
                         AND u.window_end = g.window_end
UNION ALL
SELECT 'updated', upd.quota_name, upd.member, false, 0, NULL, NULL, true, 0, upd.used_before, upd.used_after
FROM upd
UNION ALL
SELECT 'inserted', ins.quota_name, ins.member, false, 0, NULL, NULL, true, 0, 0, ins.used
FROM ins;
