-- name: OutboxEnqueue :one
-- Writes one event, in the caller's transaction when there is one: it
-- becomes visible to relays when that transaction commits, and never if it
-- rolls back.
INSERT INTO pgquota.outbox (topic, payload, grant_id, idempotency_scope, idempotency_key, fencing_token,
                            next_attempt_at, created_at)
SELECT @topic::text, @payload::bytea, sqlc.narg('grant_id')::bigint, sqlc.narg('idempotency_scope')::text,
       sqlc.narg('idempotency_key')::text, sqlc.narg('fencing_token')::bigint, c.at, c.at
FROM (SELECT pgquota.clock() AS at) c
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
RETURNING id, created_at;

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
SELECT o.id, o.topic, o.payload, o.grant_id, o.idempotency_scope, o.idempotency_key, o.fencing_token,
       o.attempts, o.created_at, pgquota.clock()::timestamptz AS db_now
FROM pgquota.outbox o
WHERE o.state = 'pending'
  AND o.next_attempt_at <= (SELECT pgquota.clock())
  AND (cardinality(@topics::text[]) = 0 OR o.topic = ANY (@topics::text[]))
ORDER BY o.id
LIMIT @batch_size::int
FOR UPDATE OF o SKIP LOCKED;

-- name: OutboxMarkDelivered :execrows
-- Marks events the relay's handler accepted. Runs in the transaction that
-- claimed (and still locks) them.
UPDATE pgquota.outbox
SET state = 'delivered',
    attempts = attempts + 1,
    last_error = NULL,
    finished_at = pgquota.clock()
WHERE id = ANY (@ids::bigint[])
  AND state = 'pending';

-- name: OutboxMarkFailed :execrows
-- Records failed deliveries: one more attempt, the error, and the next
-- attempt @delays_us microseconds after the database clock's now; an event
-- whose attempts reach @max_attempts becomes dead (the dead-letter state)
-- and is not claimed again.
UPDATE pgquota.outbox o
SET attempts = o.attempts + 1,
    last_error = f.error,
    state = CASE WHEN o.attempts + 1 >= @max_attempts::int THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN o.attempts + 1 >= @max_attempts::int THEN c.at END,
    next_attempt_at = c.at + f.delay_us * interval '1 microsecond'
FROM (
         SELECT unnest(@ids::bigint[]) AS id,
                unnest(@errors::text[]) AS error,
                unnest(@delays_us::bigint[]) AS delay_us
     ) f,
     (SELECT pgquota.clock() AS at) c
WHERE o.id = f.id
  AND o.state = 'pending';

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

-- name: OutboxReap :execrows
-- Deletes up to @batch_size finished (delivered or dead) events that
-- finished more than @older_than_us microseconds ago.
DELETE FROM pgquota.outbox
WHERE id IN (
    SELECT o.id
    FROM pgquota.outbox o
    WHERE o.state <> 'pending'
      AND o.finished_at < pgquota.clock() - sqlc.arg('older_than_us')::bigint * interval '1 microsecond'
    ORDER BY o.finished_at
    LIMIT @batch_size::int
);
