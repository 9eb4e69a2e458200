-- Batches of grants decided by pgquota.grant_limits: quotas of the kinds
-- rate, fixed and rolling, and grants against several quotas.

-- name: LimitsGrantBatch :many
-- Decides a batch of grants in ONE statement (one round trip, one commit
-- when it runs on its own): pgquota.grant_limits_batch
-- (migrations/00025_set_based_batches.sql), which locks and writes each
-- state row once and says why each request's outcome is the one
-- pgquota.grant_limits would give it, the requests run one after another
-- in array order at the batch's one instant (decided_at). Request i names the
-- quotas @quota_names[@firsts[i] .. @firsts[i] + @counts[i] - 1] for member
-- @members[i], @amounts[i] units, with the call's limit @limit_values[i]
-- (-1 for none). The rows are those of LimitsGrant (rate.sql) for each
-- request, with req_index = i (from 1), in request order.
SELECT g.req_index::integer AS req_index,
       g.ord::integer AS ord,
       g.quota_name::text AS quota_name,
       coalesce(g.kind, '')::text AS kind,
       g.found::boolean AS found,
       g.decided::boolean AS decided,
       (g.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(g.limit_value, 0)::bigint AS limit_value,
       coalesce(g.burst, 0)::bigint AS burst,
       coalesce(g.period_us, 0)::bigint AS period_us,
       g.fits::boolean AS fits,
       g.granted::boolean AS granted,
       g.used::bigint AS used,
       g.remaining::bigint AS remaining,
       g.window_start::timestamptz AS window_start,
       g.window_end::timestamptz AS window_end,
       g.retry_after_us::bigint AS retry_after_us,
       g.reset_after_us::bigint AS reset_after_us,
       g.decided_at::timestamptz AS decided_at
FROM pgquota.grant_limits_batch(
    @quota_names::text[], @firsts::integer[], @counts::integer[],
    @members::text[], @amounts::bigint[], @limit_values::bigint[]
) g;
