-- Lease administration: a payload stored with a lease (as the DynamoDB lock
-- client stores data with a lock), and pgquota.fence_guarded, which the
-- reaper asks before it deletes a fence row (queries/lease_admin.sql).
--
-- No index on lease.expires_at for the reaper: every renewal moves
-- expires_at, and an index on it would make each renewal a non-HOT update
-- (a new index entry per renewal). The reaper scans instead; it runs
-- rarely, renewals run all the time.

-- +goose Up
-- payload is data the holder stores with its lease (a leader's address, a
-- job's progress). It belongs to one acquisition: it counts only while
-- payload_token equals token, so a new holder never inherits the previous
-- holder's payload, and acquiring (queries/lease.sql) need not touch it.
ALTER TABLE pgquota.lease
    ADD COLUMN payload       text,
    ADD COLUMN payload_token bigint,
    ADD CONSTRAINT lease_payload_length CHECK (octet_length(payload) <= 65536);

-- pgquota.fence_guarded reports whether a trigger on any table runs a
-- function of schema pgquota (the fence guard, whatever its version) with
-- p_resource as one of its arguments: the resource's fence row then guards
-- an application table, whose writes are checked against the fence row
-- alone (no lease row), so the reaper must never delete it.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_guarded(p_resource text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (
        SELECT 1
        FROM pg_catalog.pg_trigger t
        JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'pgquota'
          AND position('\x00'::bytea || convert_to(p_resource, 'UTF8') || '\x00'::bytea
                       IN '\x00'::bytea || t.tgargs) > 0
    )
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.fence_guarded(text);
ALTER TABLE pgquota.lease
    DROP CONSTRAINT lease_payload_length,
    DROP COLUMN payload_token,
    DROP COLUMN payload;
