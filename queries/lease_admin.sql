-- name: LeaseRead :one
-- A lease row with its payload: the payload counts only when it was stored
-- under the row's current token (see migrations/00008_lease_admin.sql).
SELECT l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now,
       coalesce(CASE WHEN l.payload_token = l.token THEN l.payload END, '')::text AS payload
FROM pgquota.lease l, (SELECT pgquota.clock() AS at) c
WHERE l.name = @name::text;

-- name: LeaseList :many
-- Lease rows whose name starts with @prefix and sorts after @after (the
-- last name of the previous page), by name, at most @max_rows; only the
-- held ones (by the database clock) when @held_only.
SELECT l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now,
       coalesce(CASE WHEN l.payload_token = l.token THEN l.payload END, '')::text AS payload
FROM pgquota.lease l, (SELECT pgquota.clock() AS at) c
WHERE starts_with(l.name, @prefix::text)
  AND l.name > @after::text
  AND (NOT @held_only::boolean OR l.expires_at > c.at)
ORDER BY l.name
LIMIT @max_rows::int;

-- name: LeasePayloadSet :one
-- Stores @payload (NULL clears it) with the lease @name held with @token,
-- conditioned on the token and, when @require_held, on the lease being
-- held by the database clock, in the WHERE clause of the row being updated
-- (re-checked on the newest version after a lock wait), so a deposed
-- holder can never overwrite its successor's payload. Acquire calls it
-- with @require_held false in the transaction that took the lease, whose
-- row lock nobody else can have passed.
-- The statement is pgquota.lease_payload_set (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.name::text AS name,
       r.holder::text AS holder,
       r.attempt::text AS attempt,
       r.token::bigint AS token,
       r.acquired_at::timestamptz AS acquired_at,
       r.renewed_at::timestamptz AS renewed_at,
       r.expires_at::timestamptz AS expires_at,
       r.db_now::timestamptz AS db_now,
       r.payload::text AS payload
FROM pgquota.lease_payload_set(sqlc.narg('payload')::text, @name::text, @token::bigint, @require_held::boolean) r;

-- name: LeaseReap :many
-- Deletes up to @batch_size lease rows that expired more than
-- @older_than_us microseconds before the database clock's now and, when
-- @fences, the fence row of each one's own name (the resource the lease
-- fences), in ONE statement. The caller repeats it until fewer rows come
-- back. Why each row may go, and why nothing here waits:
--
--   * A lease row is locked FOR UPDATE SKIP LOCKED: a fenced write holding
--     it FOR SHARE (pgquota.fence_admit) or an acquirer updating it is
--     skipped, never waited for. The expiry guard is re-checked on the
--     newest version of a row updated since the snapshot (READ COMMITTED's
--     rule for FOR UPDATE), so a lease acquired meanwhile is not deleted.
--   * Then the acquirers' transaction-level advisory lock on the name
--     (queries/lease.sql, LeaseAcquire) is tried, not waited for: an
--     acquirer holds it from before it takes a token until it commits, so
--     a row is never deleted while an acquirer of its name is between its
--     token and its commit, whatever order that statement's steps run in.
--     The key must stay the one LeaseAcquire locks.
--   * Deleting a lease row keeps every fence: a write checked against the
--     lease (WriteFencedRow with Lease, the fenced-grant comparison path) finds no row held with its
--     token and is rejected (PQ002), and the fence row of the lease's name
--     still holds the highest token, for writes checked against it alone.
--     Tokens come from one sequence, so the next acquisition's token is
--     larger than the deleted one.
--   * A fence row goes only when asked (@fences), only with its lease row,
--     only when nothing raised it above the lease's token (no external
--     token source wrote there), when it was not written within the same
--     period, when no pgquota trigger (a guarded application table) names
--     the resource, and when no fenced writer holds it (SKIP LOCKED).
-- The statement is pgquota.lease_reap (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.name::text AS name,
       r.token::bigint AS token,
       r.expires_at::timestamptz AS expires_at,
       r.fence_deleted::boolean AS fence_deleted
FROM pgquota.lease_reap(@older_than_us::bigint, @batch_size::int, @fences::boolean) r;
