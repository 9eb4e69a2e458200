-- name: OutboxPendingGauge :one
-- The outbox gauges, read at each metrics collection while a relay runs:
-- the number of pending events, counted up to @cap through the partial
-- index outbox_pending (so the cost is bounded however far the outbox
-- lags), and the age by the database clock of the pending event with the
-- lowest id (ids increase in enqueue order), 0 when none is pending: one
-- index probe.
SELECT (SELECT count(*) FROM (SELECT 1 FROM pgquota.outbox p WHERE p.state = 'pending' LIMIT @cap::bigint) s)::bigint AS pending,
       coalesce(extract(epoch FROM c.at - (
           SELECT o.created_at FROM pgquota.outbox o WHERE o.state = 'pending' ORDER BY o.id LIMIT 1
       )), 0)::float8 AS oldest_age_seconds
FROM (SELECT pgquota.clock() AS at) c;
