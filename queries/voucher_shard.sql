-- name: VoucherShardCreate :exec
-- Creates the shards of a sharded pool: shard @shards[i] holds @totals[i]
-- units numbered @bases[i] + 1 .. @bases[i] + @totals[i] (quota/shard.go
-- computes the split).
-- The statement is pgquota.voucher_shard_create (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.voucher_shard_create(@campaign::text, @shards::integer[], @bases::bigint[], @totals::bigint[]);
