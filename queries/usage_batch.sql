-- name: UsageGrantBatch :many
-- Grants a batch of requests, in ONE statement (one round trip, one
-- commit when it runs on its own): pgquota.usage_grant_batch
-- (migrations/00009_grant_batch.sql), which says why it is exact. The
-- requests come grouped by counter: counter i is quota @quota_names[i] of
-- member @members[i] (each pair at most once), and its requests are
-- elements @firsts[i] .. @firsts[i] + @counts[i] - 1 of @amounts (units
-- asked for) and @limit_values (the call's limit, or -1 for none: the
-- member's override, else the quota's default applies). A counter's
-- requests are decided one after another in array order, exactly as if
-- each had been a UsageGrant (usage.sql) run in that order: see
-- pgquota.greedy_take.
--
-- One row comes back per counter whose quota exists, in no particular
-- order; counter_index is i (from 1). written reports that the counter went
-- from used_before to used_after (the caller replays each request's
-- outcome from used_before: quota/batch.go); when it is false no request
-- fitted, and used_after is the counter read with a fresh snapshot.
-- has_implicit_limit is false when requests without a limit of their own
-- have none (no override, no default). decided_at is the database clock's
-- instant the batch was decided at (whose window every counter is in).
SELECT b.counter_index::integer AS counter_index,
       (b.implicit_limit IS NOT NULL)::boolean AS has_implicit_limit,
       coalesce(b.implicit_limit, 0)::bigint AS implicit_limit,
       b.window_start::timestamptz AS window_start,
       b.window_end::timestamptz AS window_end,
       b.written::boolean AS written,
       b.used_before::bigint AS used_before,
       b.used_after::bigint AS used_after,
       b.decided_at::timestamptz AS decided_at
FROM pgquota.usage_grant_batch(
    @quota_names::text[], @members::text[], @firsts::integer[], @counts::integer[],
    @amounts::bigint[], @limit_values::bigint[]
) b
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');
