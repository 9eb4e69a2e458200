-- name: OutboxList :many
-- Lists outbox events for operators (pgquota outbox list), oldest id first:
-- those whose state is one of @states, with @failed_only only those whose
-- last attempt failed (last_error is cleared on delivery), of @topics when
-- given, with ids above @after_id (for paging), at most @max_events. A
-- plain read: it takes no lock and never delays a relay.
SELECT o.id, o.topic, o.payload, o.grant_id, o.idempotency_scope, o.idempotency_key, o.fencing_token,
       o.state, o.attempts, o.next_attempt_at, o.last_error, o.created_at, o.finished_at
FROM pgquota.outbox o
WHERE o.state = ANY (@states::text[])
  AND (NOT @failed_only::bool OR o.last_error IS NOT NULL)
  AND (cardinality(@topics::text[]) = 0 OR o.topic = ANY (@topics::text[]))
  AND o.id > @after_id::bigint
ORDER BY o.id
LIMIT @max_events::int;
