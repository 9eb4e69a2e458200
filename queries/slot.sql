-- name: SlotAcquire :one
-- Takes a slot of semaphore @name when fewer than @slot_limit are held, or
-- reports why not, in one call of pgquota.slot_acquire (see
-- migrations/00012_slots.sql for why the limit holds under any
-- concurrency).
SELECT r.taken::boolean AS taken, r.slot::integer AS slot, r.lease_name::text AS lease_name,
       r.holder::text AS holder, r.attempt::text AS attempt, r.token::bigint AS token,
       r.acquired_at::timestamptz AS acquired_at, r.renewed_at::timestamptz AS renewed_at,
       r.expires_at::timestamptz AS expires_at, r.db_now::timestamptz AS db_now,
       r.holders::integer AS holders, r.next_expiry::timestamptz AS next_expiry
FROM pgquota.slot_acquire(@name::text, @slot_limit::integer, @holder::text, @attempt::text, @ttl::interval) r;

-- name: SemaphoreGet :one
SELECT s.name, s.slot_limit, s.slots, s.acquisitions, s.created_at, s.updated_at, pgquota.clock() AS db_now
FROM pgquota.semaphore s
WHERE s.name = @name::text;

-- name: SlotList :many
-- The slot lease rows of semaphore @name, held or not (by the database
-- clock: compare expires_at with db_now), by slot.
-- The slot names are computed first (a materialized CTE), then joined
-- with the lease rows on their name: on Citus the lease table's
-- distribution column, which a join on an expression of the semaphore's
-- row is not (Citus refuses that join).
WITH g AS MATERIALIZED (
    SELECT g.i::int AS i, pgquota.slot_lease_name(s.name, g.i::int) AS lease_name
    FROM pgquota.semaphore s
    CROSS JOIN LATERAL generate_series(0, s.slots - 1) g(i)
    WHERE s.name = @name::text
)
SELECT g.i::int AS slot, l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at,
       c.at AS db_now,
       coalesce(CASE WHEN l.payload_token = l.token THEN l.payload END, '')::text AS payload
FROM g
JOIN pgquota.lease l ON l.name = g.lease_name
CROSS JOIN (SELECT pgquota.clock() AS at) c
ORDER BY g.i;
