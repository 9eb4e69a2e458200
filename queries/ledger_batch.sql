-- Keyed batches: GrantBatch (and coalesced Grant calls) with idempotency
-- keys. One transaction runs, in this order:
--
--   1. LedgerBatchInsert records the keyed requests' ledger rows, keys in
--      sorted order, ON CONFLICT DO NOTHING: of any number of copies of a
--      key exactly one gets a row back, as in ledger.sql. Only the requests
--      whose key it recorded (and the requests without a key) take part in
--      the grant; a key already taken is replayed from its entry
--      (LedgerBatchEntries) and writes nothing more.
--   2. UsageGrantBatch (usage_batch.sql) grants the taking part requests.
--      The ledger keys are locked before the counters, the same order as
--      ledger.sql's statements, so keyed statements cannot deadlock each
--      other.
--   3. LedgerBatchOutcomes stores each recorded request's outcome, as
--      replayed from the counter before and after.
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

-- name: LedgerBatchOutcomes :exec
-- Stores the outcomes of grants recorded by LedgerBatchInsert: grant
-- @grant_ids[i] was granted (@granted[i]) or denied against limit
-- @limit_values[i], leaving the counter of window [@window_starts[i],
-- @window_ends[i]) at @used[i].
-- The statement is pgquota.ledger_batch_outcomes (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.ledger_batch_outcomes(@grant_ids::bigint[], @granted::boolean[], @used::bigint[], @limit_values::bigint[], @window_starts::timestamptz[], @window_ends::timestamptz[]);
