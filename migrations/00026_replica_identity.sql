-- Every table of schema pgquota has a replica identity, so that logical
-- replication can carry it: a Citus rebalance (citus_rebalance_start())
-- copies reference tables and shards to a worker added to the cluster by
-- logical replication, and refused the whole rebalance for a table with
-- neither a primary key nor a REPLICA IDENTITY ("cannot use logical
-- replication to transfer shards of the relation quota_shape_defined
-- since it doesn't have a REPLICA IDENTITY or PRIMARY KEY").
--
-- The two tables without a primary key are row types only (CHECK (false):
-- they never hold a row; functions return SETOF them), so REPLICA
-- IDENTITY FULL costs nothing. migrations/replica_identity_test.go checks
-- that every table has one, so a later table without a key fails there.

-- +goose Up
ALTER TABLE pgquota.quota_shape_defined REPLICA IDENTITY FULL;
ALTER TABLE pgquota.outbox_claimed REPLICA IDENTITY FULL;

-- +goose Down
ALTER TABLE pgquota.quota_shape_defined REPLICA IDENTITY DEFAULT;
ALTER TABLE pgquota.outbox_claimed REPLICA IDENTITY DEFAULT;
