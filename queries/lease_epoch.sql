-- name: LeaseEpochGet :one
-- The epoch the next lease token is issued in (token >> 40), the WAL
-- timeline (0 on a standby), the recorded offset and epoch, and a ceiling
-- at least every token issued so far (migrations/00007_token_epoch.sql).
SELECT pgquota.lease_epoch_now()::bigint AS epoch,
       coalesce(pgquota.wal_timeline(), 0)::bigint AS timeline,
       e.timeline_offset,
       e.epoch AS recorded_epoch,
       pgquota.lease_token_ceiling()::bigint AS ceiling
FROM pgquota.lease_epoch e;

-- name: LeaseEpochBump :one
-- Raises the epoch of the next tokens to at least @min_epoch and at least
-- one above the current one; returns the new epoch.
SELECT pgquota.lease_epoch_bump(@min_epoch::bigint)::bigint AS epoch;
