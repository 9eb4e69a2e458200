-- Keyed batches: GrantBatch (and coalesced Grant calls) with idempotency
-- keys. One transaction runs, in this order:
--
--   1. LedgerBatchInsert records the keyed requests' ledger rows, keys in
--      sorted order, ON CONFLICT DO NOTHING: of any number of copies of a
--      key exactly one gets a row back, as in ledger.sql. Only the requests
--      whose key it recorded (and the requests without a key) take part in
--      the grant; a key already taken is replayed from its entry
--      (LedgerBatchEntries) and writes nothing more.
--   2. UsageGrantBatchKeyed grants the taking part requests with
--      pgquota.usage_grant_batch (usage_batch.sql) and, in the same
--      statement, stores each recorded request's outcome, as replayed from
--      the counter before: the outcome is the one the grant decided, never
--      one the caller sends. The ledger keys are locked before the
--      counters, the same order as ledger.sql's statements, so keyed
--      statements cannot deadlock each other.
--
-- The ledger rows, the counter change and the outcomes commit together or
-- not at all, as a single keyed statement's do.

-- name: LedgerBatchInsert :many
-- Records keyed grant requests in the ledger: request i is key @keys[i] in
-- scope @scopes[i], for @amounts[i] units of quota @quota_names[i] to
-- member @members[i], with the call's limit @limit_values[i] (-1 for none).
-- As for LedgerGrant, a request is recorded only when its quota exists and
-- a limit applies to it. Keys must be distinct. Returns the keys recorded
-- now, with their grant ids; a key already in the ledger (committed, or
-- committed while this statement waited for it) returns nothing.
-- The statement is pgquota.ledger_batch_insert (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.scope::text AS scope,
       r.idempotency_key::text AS idempotency_key,
       r.grant_id::bigint AS grant_id
FROM pgquota.ledger_batch_insert(@scopes::text[], @keys::text[], @quota_names::text[], @members::text[], @amounts::bigint[], @limit_values::bigint[]) r;

-- name: LedgerBatchEntries :many
-- The ledger entries of keys @keys[i] in scopes @scopes[i] that exist.
SELECT e.grant_id, e.scope, e.idempotency_key, e.operation, e.target, e.member, e.amount, e.request_limit,
       e.created_at, e.granted, e.used, e.limit_value, e.revoked, e.window_start, e.window_end, e.seq,
       e.code, e.repeat, e.claimed_at, e.decided_at, e.compensated, e.compensated_used, e.compensated_at
FROM pgquota.ledger_entry e
WHERE (e.scope, e.idempotency_key) IN (
    SELECT unnest(@scopes::text[]), unnest(@keys::text[])
);

-- name: UsageGrantBatchKeyed :many
-- UsageGrantBatch (usage_batch.sql), with @grant_ids: element j is the
-- grant id LedgerBatchInsert returned for request j, or 0 for a request
-- without a key recorded now. The statement grants the batch and stores
-- the outcome of every recorded key as it decided it (granted or denied,
-- the counter after the request, the limit, the window, the batch's
-- decision instant). A grant id that is not an undecided ledger entry of
-- exactly its request fails the statement with 22023, nothing written. A
-- recorded key whose request could not be decided (quota or limit gone)
-- gets no outcome: the caller rolls back. Rows as UsageGrantBatch's.
-- The statement is pgquota.usage_grant_batch_keyed (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT b.counter_index::integer AS counter_index,
       (b.implicit_limit IS NOT NULL)::boolean AS has_implicit_limit,
       coalesce(b.implicit_limit, 0)::bigint AS implicit_limit,
       b.window_start::timestamptz AS window_start,
       b.window_end::timestamptz AS window_end,
       b.written::boolean AS written,
       b.used_before::bigint AS used_before,
       b.used_after::bigint AS used_after,
       b.decided_at::timestamptz AS decided_at
FROM pgquota.usage_grant_batch_keyed(
    @quota_names::text[], @members::text[], @firsts::integer[], @counts::integer[],
    @amounts::bigint[], @limit_values::bigint[], @grant_ids::bigint[]
) b
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');
