-- name: OutboxEnqueue :one
-- Writes one event, in the caller's transaction when there is one: it
-- becomes visible to relays when that transaction commits, and never if it
-- rolls back.
-- The statement is pgquota.outbox_enqueue (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.id::bigint AS id,
       r.created_at::timestamptz AS created_at
FROM pgquota.outbox_enqueue(@topic::text, @payload::bytea, sqlc.narg('grant_id')::bigint, sqlc.narg('idempotency_scope')::text, sqlc.narg('idempotency_key')::text, sqlc.narg('fencing_token')::bigint) r;

-- name: OutboxClaim :many
-- Claims up to @batch_size pending events that are due, oldest id first,
-- for the relay's transaction. FOR UPDATE SKIP LOCKED passes over rows that
-- another relay holds, so relays running at once take disjoint batches and
-- none waits for another. Under READ COMMITTED, a row that another relay
-- delivered and committed after this statement's snapshot was taken is
-- re-checked on its newest version and left out (section 13.2.1), so it is
-- not delivered twice. There is no cursor: every pending row is a candidate
-- on every call, whatever its id, so a row whose transaction committed late
-- is claimed by the next call that finds it. db_now, the database clock as
-- each row is returned, gives the event's age at the claim (the delivery
-- latency metric).
-- The statement is pgquota.outbox_claim (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT * FROM pgquota.outbox_claim(@topics::text[], @batch_size::int);

-- name: OutboxMarkDelivered :one
-- Marks events the relay's handler accepted. Runs in the transaction that
-- claimed (and still locks) them.
-- The statement is pgquota.outbox_mark_delivered (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.outbox_mark_delivered(@ids::bigint[])::bigint AS rows;

-- name: OutboxMarkFailed :one
-- Records failed deliveries: one more attempt, the error, and the next
-- attempt @delays_us microseconds after the database clock's now; an event
-- whose attempts reach @max_attempts becomes dead (the dead-letter state)
-- and is not claimed again.
-- The statement is pgquota.outbox_mark_failed (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.outbox_mark_failed(@max_attempts::int, @ids::bigint[], @errors::text[], @delays_us::bigint[])::bigint AS rows;

-- name: OutboxStatus :one
-- Counts by state and the lag: the age of the oldest pending event by the
-- database clock (0 when none is pending).
SELECT count(*) FILTER (WHERE o.state = 'pending')::bigint AS pending,
       count(*) FILTER (WHERE o.state = 'pending' AND o.attempts > 0)::bigint AS retrying,
       count(*) FILTER (WHERE o.state = 'delivered')::bigint AS delivered,
       count(*) FILTER (WHERE o.state = 'dead')::bigint AS dead,
       coalesce(extract(epoch FROM c.at - min(o.created_at) FILTER (WHERE o.state = 'pending')), 0)::float8 AS lag_seconds,
       c.at::timestamptz AS now
FROM (SELECT pgquota.clock() AS at) c
LEFT JOIN pgquota.outbox o ON true
GROUP BY c.at;

-- name: OutboxGet :one
SELECT id, topic, payload, grant_id, idempotency_scope, idempotency_key, fencing_token, state, attempts,
       next_attempt_at, last_error, created_at, finished_at
FROM pgquota.outbox
WHERE id = @id::bigint;

-- name: OutboxReap :one
-- Deletes up to @batch_size finished (delivered or dead) events that
-- finished more than @older_than_us microseconds ago.
-- The statement is pgquota.outbox_reap (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.outbox_reap(@older_than_us::bigint, @batch_size::int)::bigint AS rows;
