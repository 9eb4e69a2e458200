-- name: LeaseEpochGet :one
-- The epoch the next lease token is issued in (token >> 40), the WAL
-- timeline (0 on a standby), the recorded offset and epoch, and a ceiling
-- at least every token issued so far (migrations/00007_token_epoch.sql).
SELECT pgquota.lease_epoch_now()::bigint AS epoch,
       coalesce(pgquota.wal_timeline(), 0)::bigint AS timeline,
       e.timeline_offset,
       e.epoch AS recorded_epoch,
       pgquota.lease_token_ceiling()::bigint AS ceiling,
       coalesce(e.pending_epoch, 0)::bigint AS pending_epoch
FROM pgquota.lease_epoch e;

-- name: LeaseEpochBump :one
-- Raises the epoch of the next tokens to at least @min_epoch and at least
-- one above the current one; returns the new epoch.
SELECT pgquota.lease_epoch_bump(@min_epoch::bigint)::bigint AS epoch;

-- name: LeaseEpochPrepare :one
-- Records the epoch a bump raises to (at least min_epoch, at least one
-- above the current one) as pending; tokens keep their epoch until
-- LeaseEpochRaise (migrations/00019_epoch_floor.sql).
SELECT pgquota.lease_epoch_prepare(@min_epoch::bigint)::bigint AS epoch;

-- name: CurrentWALLSN :one
-- The primary's WAL write position, at least the end of every commit that
-- returned before it.
SELECT pg_current_wal_lsn()::text AS lsn;

-- name: LeaseEpochStandbys :many
-- The standbys the primary knows and whether each flushed WAL up to lsn.
SELECT s.name::text AS name, coalesce(s.state, '')::text AS state,
       coalesce(s.flushed_lsn::text, '')::text AS flushed_lsn, s.confirmed::boolean AS confirmed
FROM pgquota.lease_epoch_standbys(CAST(@lsn::text AS pg_lsn)) s;

-- name: LeaseEpochRaise :one
-- Makes the prepared epoch the epoch of the next tokens; returns it.
SELECT pgquota.lease_epoch_raise(@epoch::bigint)::bigint AS epoch;
