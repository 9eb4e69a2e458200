-- Fencing tokens that survive crashes and failovers.
--
-- 1. Durability. An acquire, renew, release or fenced write that reported
--    success must survive a crash even when the role or database runs with
--    synchronous_commit = off (PostgreSQL manual, section 30.4 "Asynchronous
--    Commit": an immediate shutdown or crash loses the last transactions
--    reported committed). A lost acquire lets the sequence hand the same
--    token to the next holder: two holders, one token. Each such statement
--    calls pgquota.durable_commit() (LeaseAcquire, LeaseRenew and
--    LeaseRelease directly, fenced writes and the guard trigger through
--    pgquota.fence_admit, tokens through pgquota.next_lease_token), which
--    raises the transaction's synchronous_commit from off to on
--    (set_config(..., true): this transaction only; the setting is read at
--    commit, so it also works inside the caller's transaction and behind
--    transaction poolers).
--    'local', 'remote_write', 'on' and 'remote_apply' all flush the commit
--    to the local WAL before returning and are kept as they are: 'local'
--    (and a role without synchronous standbys) survives a crash, but a
--    failover to an asynchronous standby can still lose the last commits;
--    then the epoch below still keeps tokens from going backwards.
--
-- 2. Epochs. A token is (epoch << 40) + n, n from pgquota.lease_token
--    (bounded below 2^40: an error, never a wrap), epoch = the server's WAL
--    timeline + timeline_offset. The timeline grows by one at every
--    promotion of a standby (and every point-in-time recovery), so every
--    token issued after a promotion exceeds every token issued before it,
--    even those the standby never received (ZooKeeper's zxid keeps its
--    leader epoch in the high 32 bits the same way). The timeline is read
--    as the first 8 hex digits of pg_walfile_name(pg_current_wal_lsn()):
--    the WAL insert timeline, right from the moment pg_promote() returns,
--    for any role (pg_control_checkpoint() still shows the old timeline
--    until the next checkpoint).
--
--    A new cluster restarts at timeline 1 (pg_dump/pg_restore, pg_upgrade,
--    logical replication into a new cluster): a changed
--    pg_control_system().system_identifier is detected on the first token
--    and the offset is raised so that the epoch becomes the highest epoch
--    recorded so far plus the timeline, above every epoch of the dump. Where
--    the source issued tokens in later epochs after the dump was taken, or
--    a file-system snapshot of the same cluster is restored without a new
--    timeline, an operator raises it by hand: pgquota.lease_epoch_bump()
--    (`pgquota lease epoch bump`).
--
--    Tokens issued before this migration stay valid (held leases, fence
--    high-water marks are untouched); the first epoch is chosen above the
--    highest token issued so far, so every new token exceeds every old one.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION pgquota.durable_commit() RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_admit as in 00003_lease.sql, and it makes the commit of
-- the writing transaction durable first: every fenced write (FenceWrite,
-- GrantFenced's counter write, the guard trigger on application tables)
-- survives a crash once it reported success. A write checked against no
-- lease (an external token) on a resource whose guarded table takes lease
-- tokens (pgquota.fence_guard_resource, attached without --external) is
-- refused with PQ002 when its token is above every token pgquota's leases
-- have issued (pgquota.lease_token_ceiling): such a token was invented, and
-- admitting it would raise the resource's mark past every real holder for
-- good.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.fence_admit(p_resource text, p_token bigint, p_lease text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_lease_token bigint;
    v_highest     bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    IF p_token IS NULL THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token: a write to resource %s carries no token', p_resource),
            DETAIL  = json_build_object('resource', p_resource, 'token', NULL, 'highest', coalesce(v_highest, 0))::text;
    END IF;
    IF p_lease IS NULL
       AND EXISTS (SELECT 1 FROM pgquota.fence_guard_resource g WHERE g.resource = p_resource AND NOT g.external)
       AND p_token > pgquota.lease_token_ceiling() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ002',
            MESSAGE = format('pgquota: fencing token %s for resource %s was never issued by a pgquota lease (the highest issued is at most %s): its guarded table takes lease tokens (attach the guard with --external for tokens of another lock service)',
                             p_token, p_resource, pgquota.lease_token_ceiling()),
            DETAIL  = json_build_object('lease', NULL, 'token', p_token)::text;
    END IF;
    IF p_lease IS NOT NULL THEN
        PERFORM 1 FROM pgquota.lease l
        WHERE l.name = p_lease AND l.token = p_token AND l.expires_at > pgquota.clock()
        FOR SHARE;
        IF NOT FOUND THEN
            SELECT l.token INTO v_lease_token FROM pgquota.lease l WHERE l.name = p_lease;
            IF v_lease_token > p_token THEN
                SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
                v_highest := greatest(v_lease_token, v_highest);
                RAISE EXCEPTION USING
                    ERRCODE = 'PQ001',
                    MESSAGE = format('pgquota: stale fencing token %s for resource %s: lease %s was acquired since with token %s',
                                     p_token, p_resource, p_lease, v_lease_token),
                    DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
            END IF;
            RAISE EXCEPTION USING
                ERRCODE = 'PQ002',
                MESSAGE = format('pgquota: lease %s is not held with token %s (expired, released or never acquired with it)',
                                 p_lease, p_token),
                DETAIL  = json_build_object('lease', p_lease, 'token', p_token)::text;
        END IF;
    END IF;
    INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
    VALUES (p_resource, p_token, pgquota.clock())
    ON CONFLICT (resource) DO UPDATE
    SET max_token = excluded.max_token,
        updated_at = excluded.updated_at
    WHERE f.max_token <= excluded.max_token;
    IF NOT FOUND THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token %s for resource %s: highest token seen is %s',
                             p_token, p_resource, v_highest),
            DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- The current WAL insert timeline; NULL on a standby (in recovery).
-- +goose StatementBegin
CREATE FUNCTION pgquota.wal_timeline() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END
$$;
-- +goose StatementEnd

-- One row: the cluster it was last written on, the offset added to the
-- timeline, and the highest epoch tokens were issued in.
CREATE TABLE pgquota.lease_epoch (
    id                boolean     NOT NULL PRIMARY KEY DEFAULT true,
    system_identifier bigint      NOT NULL,
    timeline_offset   bigint      NOT NULL,
    epoch             bigint      NOT NULL,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT lease_epoch_one_row CHECK (id),
    CONSTRAINT lease_epoch_range CHECK (epoch BETWEEN 1 AND 8388607)
);

-- +goose StatementBegin
DO $$
DECLARE
    v_seq     bigint;
    v_called  boolean;
    v_old_max bigint;
    v_tl      bigint := pgquota.wal_timeline();
BEGIN
    SELECT last_value, is_called INTO v_seq, v_called FROM pgquota.lease_token;
    SELECT greatest(CASE WHEN v_called THEN v_seq ELSE v_seq - 1 END,
                    (SELECT max(token) FROM pgquota.lease),
                    (SELECT max(f.max_token) FROM pgquota.fence f
                     WHERE EXISTS (SELECT 1 FROM pgquota.lease l WHERE l.name = f.resource)),
                    0)
    INTO v_old_max;
    IF v_seq >= (1::bigint << 40) THEN
        -- The epoch alone puts new tokens above old ones: n may restart.
        ALTER SEQUENCE pgquota.lease_token RESTART WITH 1;
    END IF;
    ALTER SEQUENCE pgquota.lease_token MAXVALUE 1099511627775;
    -- The first epoch e satisfies (e << 40) + 1 > every old token.
    INSERT INTO pgquota.lease_epoch (system_identifier, timeline_offset, epoch, updated_at)
    SELECT s.system_identifier, e - v_tl, e, clock_timestamp()
    FROM pg_control_system() s,
         LATERAL (SELECT greatest(v_tl, (v_old_max >> 40) + 1) AS e) x;
END
$$;
-- +goose StatementEnd

-- pgquota.system_identifier returns pg_control_system().system_identifier,
-- the identity of the cluster (initdb; a standby shares its primary's).
-- Reading it reads the control file, so the value is cached in the
-- session's setting pgquota.system_identifier: a fact about the server the
-- session is connected to, so also right behind a transaction pooler
-- (DISCARD ALL or a rollback only clears the cache).
-- +goose StatementBegin
CREATE FUNCTION pgquota.system_identifier() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v text := current_setting('pgquota.system_identifier', true);
BEGIN
    IF v IS NULL OR v = '' THEN
        v := (SELECT system_identifier FROM pg_control_system())::text;
        PERFORM set_config('pgquota.system_identifier', v, false);
    END IF;
    RETURN v::bigint;
END
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_for returns the epoch the next token is issued in,
-- given the recorded row (epoch, offset, cluster) and the server's cluster
-- and timeline: the recorded epoch on a standby (timeline NULL); else
-- timeline + offset, or, on another cluster than the row was recorded on
-- (a restored dump, pg_upgrade) or when that would not exceed the recorded
-- epoch, the recorded epoch plus the timeline. Always >= the recorded epoch;
-- on one cluster it grows with the timeline, so a standby promoted after
-- missing the row's last change still lands above the epoch it missed.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_for(p_epoch bigint, p_offset bigint, p_row_system bigint, p_system bigint, p_timeline bigint)
    RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN p_timeline IS NULL THEN p_epoch
                WHEN p_row_system = p_system AND p_timeline + p_offset >= p_epoch THEN p_timeline + p_offset
                ELSE p_epoch + p_timeline END
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_now returns the epoch the next token is issued in,
-- without writing (pgquota.lease_epoch_for on the recorded row).
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_now() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_row pgquota.lease_epoch;
BEGIN
    SELECT * INTO v_row FROM pgquota.lease_epoch;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
    END IF;
    RETURN pgquota.lease_epoch_for(v_row.epoch, v_row.timeline_offset, v_row.system_identifier,
                                   pgquota.system_identifier(), pgquota.wal_timeline());
END
$$;
-- +goose StatementEnd

-- pgquota.next_lease_token issues a new token: (epoch << 40) + nextval.
-- The first token of a new epoch records it (and the cluster, and the
-- offset) in pgquota.lease_epoch in the same transaction, by a
-- compare-and-set on the row as read (a concurrent first token makes it
-- look again, with a fresh snapshot; under REPEATABLE READ or SERIALIZABLE
-- it fails with 40001 instead). It makes the transaction's commit durable
-- (pgquota.durable_commit). Raises 25006 on a standby, 2200H
-- (sequence_generator_limit_exceeded) after 2^40 - 1 tokens in all, and
-- 22003 past epoch 8388607: never a wrap.
-- +goose StatementBegin
CREATE FUNCTION pgquota.next_lease_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_sys   bigint;
    v_tl    bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    LOOP
        v_tl := pgquota.wal_timeline();
        IF v_tl IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: cannot issue a lease token on a standby (recovery is in progress)';
        END IF;
        v_sys := pgquota.system_identifier();
        SELECT * INTO v_row FROM pgquota.lease_epoch;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
        END IF;
        v_epoch := pgquota.lease_epoch_for(v_row.epoch, v_row.timeline_offset, v_row.system_identifier, v_sys, v_tl);
        IF v_epoch > 8388607 THEN
            RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
        END IF;
        EXIT WHEN v_row.epoch = v_epoch AND v_row.system_identifier = v_sys AND v_row.timeline_offset = v_epoch - v_tl;
        UPDATE pgquota.lease_epoch
        SET system_identifier = v_sys, timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = clock_timestamp()
        WHERE epoch = v_row.epoch AND system_identifier = v_row.system_identifier AND timeline_offset = v_row.timeline_offset;
    END LOOP;
    RETURN (v_epoch << 40) + nextval('pgquota.lease_token');
END
$$;
-- +goose StatementEnd

-- pgquota.lease_token_ceiling returns a token at least as high as every
-- token issued so far, also those issued by a former primary in an earlier
-- epoch that this server never received, and those of acquires still in
-- flight (nextval is not transactional): a token above it was never
-- issued. It writes nothing.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_token_ceiling() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$
    SELECT (pgquota.lease_epoch_now() << 40) + s.last_value - CASE WHEN s.is_called THEN 0 ELSE 1 END
    FROM pgquota.lease_token s
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_bump raises the epoch of the next tokens to at least
-- p_min_epoch, and at least one above the epoch tokens are issued in now;
-- it returns the new epoch. For a cluster restored from a dump or a
-- snapshot taken while the source went on issuing tokens. Run it on the
-- primary and let it reach the standbys before a failover: a standby
-- promoted without it issues tokens in its own, lower epoch.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_bump(p_min_epoch bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_epoch bigint;
    v_tl    bigint := pgquota.wal_timeline();
BEGIN
    IF v_tl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: the lease epoch can only be raised on a primary';
    END IF;
    PERFORM pgquota.durable_commit();
    PERFORM 1 FROM pgquota.lease_epoch FOR UPDATE;
    v_epoch := greatest(pgquota.lease_epoch_now() + 1, coalesce(p_min_epoch, 0));
    IF v_epoch > 8388607 THEN
        RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
    END IF;
    UPDATE pgquota.lease_epoch
    SET system_identifier = pgquota.system_identifier(),
        timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = clock_timestamp();
    RETURN v_epoch;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Tokens issued from now on by 00003's nextval continue above every token
-- issued in an epoch.
-- +goose StatementBegin
DO $$
DECLARE
    v_ceiling bigint := pgquota.lease_token_ceiling();
BEGIN
    ALTER SEQUENCE pgquota.lease_token NO MAXVALUE;
    PERFORM setval('pgquota.lease_token', greatest(v_ceiling, 1));
END
$$;
-- +goose StatementEnd
-- fence_admit as 00003_lease.sql created it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.fence_admit(p_resource text, p_token bigint, p_lease text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_lease_token bigint;
    v_highest     bigint;
BEGIN
    IF p_token IS NULL THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token: a write to resource %s carries no token', p_resource),
            DETAIL  = json_build_object('resource', p_resource, 'token', NULL, 'highest', coalesce(v_highest, 0))::text;
    END IF;
    IF p_lease IS NOT NULL THEN
        PERFORM 1 FROM pgquota.lease l
        WHERE l.name = p_lease AND l.token = p_token AND l.expires_at > pgquota.clock()
        FOR SHARE;
        IF NOT FOUND THEN
            SELECT l.token INTO v_lease_token FROM pgquota.lease l WHERE l.name = p_lease;
            IF v_lease_token > p_token THEN
                SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
                v_highest := greatest(v_lease_token, v_highest);
                RAISE EXCEPTION USING
                    ERRCODE = 'PQ001',
                    MESSAGE = format('pgquota: stale fencing token %s for resource %s: lease %s was acquired since with token %s',
                                     p_token, p_resource, p_lease, v_lease_token),
                    DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
            END IF;
            RAISE EXCEPTION USING
                ERRCODE = 'PQ002',
                MESSAGE = format('pgquota: lease %s is not held with token %s (expired, released or never acquired with it)',
                                 p_lease, p_token),
                DETAIL  = json_build_object('lease', p_lease, 'token', p_token)::text;
        END IF;
    END IF;
    INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
    VALUES (p_resource, p_token, pgquota.clock())
    ON CONFLICT (resource) DO UPDATE
    SET max_token = excluded.max_token,
        updated_at = excluded.updated_at
    WHERE f.max_token <= excluded.max_token;
    IF NOT FOUND THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token %s for resource %s: highest token seen is %s',
                             p_token, p_resource, v_highest),
            DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd
DROP FUNCTION pgquota.lease_epoch_bump(bigint);
DROP FUNCTION pgquota.lease_token_ceiling();
DROP FUNCTION pgquota.next_lease_token();
DROP FUNCTION pgquota.lease_epoch_now();
DROP FUNCTION pgquota.lease_epoch_for(bigint, bigint, bigint, bigint, bigint);
DROP FUNCTION pgquota.system_identifier();
DROP TABLE pgquota.lease_epoch;
DROP FUNCTION pgquota.wal_timeline();
DROP FUNCTION pgquota.durable_commit();
