-- name: UsageFencedRead :one
-- (This file holds the queries of the fenced-lock grant,
-- fencedgrant.Granter.Grant (internal/fencedgrant, a comparison path): the read-decide-write way of granting quota,
-- kept beside the conditional update of usage.sql for comparison.)
--
-- Reads a member's counter in the current window and the limit that
-- applies (the call's, else the member's override, else the quota's
-- default), for the decision of a fenced grant. A plain read: the lease and
-- the fenced write make the decision safe, not this statement.
WITH def AS (
    SELECT q.name,
           coalesce(sqlc.narg('limit_value')::bigint, o.limit_value, q.default_limit) AS limit_value,
           pgquota.window_start(q.window_unit, q.time_zone, c.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, c.at) AS window_end
    FROM pgquota.quota q
    CROSS JOIN (SELECT pgquota.clock() AS at) c
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = @member::text
    WHERE q.name = @quota_name::text
)
SELECT (def.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(def.limit_value, 0)::bigint AS limit_value,
       def.window_start::timestamptz AS window_start,
       def.window_end::timestamptz AS window_end,
       coalesce((
           SELECT u.used FROM pgquota.usage u
           WHERE u.quota_name = def.name
             AND u.member = @member::text
             AND u.window_start = def.window_start
             AND u.window_end = def.window_end
       ), 0)::bigint AS used
FROM def;

-- name: UsageFencedWrite :one
-- Grants @amount units of a member's counter in the current window (the
-- database clock's, from the quota's definition) against the call's limit
-- @limit_value (NULL: the member's override, else the quota's default), in
-- ONE statement: pgquota.fence_admit first checks that lease @lease is held
-- with @token (locking it FOR SHARE) and raises the high-water mark of
-- resource @lease, or raises PQ001/PQ002 and nothing is written. The fence
-- is what makes the read-decide-write safe among fenced grants. The
-- function computes the new counter itself: it moves by @amount only while
-- the counter still holds @read_used, the value the decision was made on
-- (a Revoke or Grant does not take the lease, and one that changed the
-- counter since the read must not be undone), and only when @amount fits
-- the limit. No row comes back when it did not; nothing was written, and
-- the caller reads again.
-- The statement is pgquota.usage_fenced_write (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.used::bigint AS used,
       r.window_start::timestamptz AS window_start,
       r.window_end::timestamptz AS window_end
FROM pgquota.usage_fenced_write(@quota_name::text, @member::text, @amount::bigint, sqlc.narg('limit_value')::bigint, @lease::text, @token::bigint, @read_used::bigint) r;
