-- name: VoucherShardCreate :exec
-- Creates the shards of a sharded pool: shard @shards[i] holds @totals[i]
-- units numbered @bases[i] + 1 .. @bases[i] + @totals[i] (quota/shard.go
-- computes the split).
INSERT INTO pgquota.voucher_shard (campaign, shard, base, total)
SELECT @campaign::text,
       unnest(@shards::integer[]),
       unnest(@bases::bigint[]),
       unnest(@totals::bigint[]);
