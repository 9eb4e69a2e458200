-- Epochs that no client setting decides, and epoch bumps that reach the
-- standbys before they take effect.
--
-- 1. pgquota.system_identifier() (00007) cached
--    pg_control_system().system_identifier in the session setting
--    pgquota.system_identifier, which any client can SET: with a wrong
--    value every token looked like the first one on another cluster and
--    raised the epoch by the timeline (one per acquire, towards 22003). It
--    now reads the control file every time (pg_control_system(), executable
--    by PUBLIC on PostgreSQL 15; a read of the 8 kB pg_control file), and no
--    session state enters a token or an epoch.
--
-- 2. A bump in two steps. pgquota.lease_epoch_bump (00007) raises the epoch
--    at once; a standby that has not received it (asynchronous, cut off,
--    lagging) issues tokens after its promotion in timeline + its own
--    offset, which equals or is below the bumped epoch: tokens went
--    backwards. Now:
--      a. pgquota.lease_epoch_prepare(min) records the epoch E the bump will
--         raise to as pending_epoch, with the timeline it was prepared on,
--         and commits. Tokens are still issued in the old epoch.
--      b. The caller waits until every standby the primary knows
--         (pgquota.lease_epoch_standbys(lsn): walsenders of
--         pg_stat_replication and inactive physical replication slots) has
--         flushed the prepare's WAL (a promotion replays all flushed WAL).
--      c. pgquota.lease_epoch_raise(E) makes E the epoch of the next tokens.
--    A server whose timeline is above the pending record's (a standby
--    promoted after it received the prepare, whether or not it received
--    the raise), or that runs on another cluster, issues tokens above the
--    pending epoch (pgquota.lease_epoch_floor). So every standby that
--    confirmed the prepare lands above every token of E once promoted, and
--    a bump that a standby did not confirm is not raised (the Go client and
--    `pgquota lease epoch bump` refuse, unless told to proceed).
--    pgquota.lease_epoch_bump keeps raising at once, for SQL callers who
--    have no standbys; it waits for nothing.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.system_identifier() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$
    SELECT s.system_identifier FROM pg_catalog.pg_control_system() s
$$;
-- +goose StatementEnd

ALTER TABLE pgquota.lease_epoch
    ADD COLUMN pending_epoch bigint,
    ADD COLUMN pending_timeline bigint,
    ADD CONSTRAINT lease_epoch_pending_range CHECK (pending_epoch BETWEEN 1 AND 8388607),
    ADD CONSTRAINT lease_epoch_pending_timeline CHECK ((pending_epoch IS NULL) = (pending_timeline IS NULL));

-- pgquota.lease_epoch_floor returns the lowest epoch the next token may
-- carry because of a pending (prepared, maybe not raised) bump: 0 when
-- there is none, on a standby, or on the timeline it was prepared on (the
-- primary that prepared it keeps its epoch until the raise); above the
-- pending epoch by the timelines since, after a promotion; the pending
-- epoch plus the timeline on another cluster.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_floor(p_pending bigint, p_pending_timeline bigint, p_row_system bigint, p_system bigint, p_timeline bigint)
    RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN p_pending IS NULL OR p_timeline IS NULL THEN 0
                WHEN p_row_system <> p_system THEN p_pending + p_timeline
                WHEN p_timeline > p_pending_timeline THEN p_pending + (p_timeline - p_pending_timeline)
                ELSE 0 END
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_now as in 00007, and at least the pending floor.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.lease_epoch_now() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_row pgquota.lease_epoch;
    v_sys bigint := pgquota.system_identifier();
    v_tl  bigint := pgquota.wal_timeline();
BEGIN
    SELECT * INTO v_row FROM pgquota.lease_epoch;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
    END IF;
    RETURN greatest(pgquota.lease_epoch_for(v_row.epoch, v_row.timeline_offset, v_row.system_identifier, v_sys, v_tl),
                    pgquota.lease_epoch_floor(v_row.pending_epoch, v_row.pending_timeline, v_row.system_identifier, v_sys, v_tl));
END
$$;
-- +goose StatementEnd

-- pgquota.next_lease_token as in 00007, with the pending floor: the first
-- token above a pending epoch records it and clears the pending record.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.next_lease_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_sys   bigint;
    v_tl    bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    v_sys := pgquota.system_identifier();
    LOOP
        v_tl := pgquota.wal_timeline();
        IF v_tl IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: cannot issue a lease token on a standby (recovery is in progress)';
        END IF;
        SELECT * INTO v_row FROM pgquota.lease_epoch;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
        END IF;
        v_epoch := greatest(pgquota.lease_epoch_for(v_row.epoch, v_row.timeline_offset, v_row.system_identifier, v_sys, v_tl),
                            pgquota.lease_epoch_floor(v_row.pending_epoch, v_row.pending_timeline, v_row.system_identifier, v_sys, v_tl));
        IF v_epoch > 8388607 THEN
            RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
        END IF;
        EXIT WHEN v_row.epoch = v_epoch AND v_row.system_identifier = v_sys AND v_row.timeline_offset = v_epoch - v_tl;
        UPDATE pgquota.lease_epoch
        SET system_identifier = v_sys, timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = clock_timestamp(),
            pending_epoch = CASE WHEN pending_epoch > v_epoch THEN pending_epoch END,
            pending_timeline = CASE WHEN pending_epoch > v_epoch THEN pending_timeline END
        WHERE epoch = v_row.epoch AND system_identifier = v_row.system_identifier AND timeline_offset = v_row.timeline_offset;
    END LOOP;
    RETURN (v_epoch << 40) + nextval('pgquota.lease_token');
END
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_prepare records the epoch a bump will raise to: at
-- least p_min_epoch and at least one above the epoch tokens are issued in
-- now (or above a higher bump prepared on this timeline). Returns it.
-- Tokens keep their epoch until pgquota.lease_epoch_raise. The commit asks
-- standbys to report as soon as they have applied it (synchronous_commit
-- remote_apply for this transaction: with synchronous standbys it also
-- waits for them).
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_prepare(p_min_epoch bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_tl    bigint := pgquota.wal_timeline();
BEGIN
    IF v_tl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: the lease epoch can only be raised on a primary';
    END IF;
    IF p_min_epoch < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('pgquota: minimum epoch must be 0 or more, got %s', p_min_epoch);
    END IF;
    PERFORM set_config('synchronous_commit', 'remote_apply', true);
    SELECT * INTO v_row FROM pgquota.lease_epoch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
    END IF;
    v_epoch := greatest(pgquota.lease_epoch_now() + 1, coalesce(p_min_epoch, 0));
    IF v_epoch > 8388607 THEN
        RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = format('pgquota: lease token epoch %s is out of range', v_epoch);
    END IF;
    UPDATE pgquota.lease_epoch
    SET pending_epoch = CASE WHEN pending_timeline = v_tl THEN greatest(pending_epoch, v_epoch) ELSE v_epoch END,
        pending_timeline = v_tl,
        updated_at = clock_timestamp();
    RETURN v_epoch;
END
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_raise makes p_epoch, prepared on this timeline by
-- pgquota.lease_epoch_prepare, the epoch of the next tokens (unless they
-- are already issued in a higher one); returns the epoch of the next
-- token. 55000 when no bump of at least p_epoch was prepared on this
-- timeline.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_raise(p_epoch bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_row   pgquota.lease_epoch;
    v_epoch bigint;
    v_tl    bigint := pgquota.wal_timeline();
BEGIN
    IF v_tl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = 'pgquota: the lease epoch can only be raised on a primary';
    END IF;
    PERFORM pgquota.durable_commit();
    SELECT * INTO v_row FROM pgquota.lease_epoch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgquota: pgquota.lease_epoch is empty: migrate down to version 6 and up again';
    END IF;
    IF v_row.pending_epoch IS NULL OR v_row.pending_timeline <> v_tl OR v_row.pending_epoch < p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('pgquota: lease epoch %s was not prepared on timeline %s (pgquota.lease_epoch_prepare first)', p_epoch, v_tl);
    END IF;
    v_epoch := greatest(pgquota.lease_epoch_now(), p_epoch);
    UPDATE pgquota.lease_epoch
    SET system_identifier = pgquota.system_identifier(),
        timeline_offset = v_epoch - v_tl, epoch = v_epoch, updated_at = clock_timestamp(),
        pending_epoch = CASE WHEN pending_epoch > v_epoch THEN pending_epoch END,
        pending_timeline = CASE WHEN pending_epoch > v_epoch THEN pending_timeline END;
    RETURN v_epoch;
END
$$;
-- +goose StatementEnd

-- pgquota.lease_epoch_standbys lists the standbys the primary knows and
-- whether each has flushed WAL up to p_lsn: every physical walsender of
-- pg_stat_replication (logical ones and base backups excluded) and every
-- inactive physical replication slot (a standby configured with a slot,
-- disconnected now). flushed_lsn is NULL when the caller may not read the
-- positions (PostgreSQL shows them to superusers and pg_read_all_stats
-- only). A standby that is disconnected and has no slot is not known.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_epoch_standbys(p_lsn pg_lsn)
    RETURNS TABLE (name text, state text, flushed_lsn pg_lsn, confirmed boolean)
    LANGUAGE sql VOLATILE
    AS $$
    SELECT coalesce(nullif(r.application_name, ''), 'pid ' || r.pid) || coalesce(' (' || host(r.client_addr) || ')', ''),
           r.state, r.flush_lsn, coalesce(r.flush_lsn >= p_lsn, false)
    FROM pg_catalog.pg_stat_replication r
    WHERE r.state IS DISTINCT FROM 'backup'
      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s
                      WHERE s.active_pid = r.pid AND s.slot_type = 'logical')
    UNION ALL
    SELECT 'slot ' || s.slot_name, 'disconnected', s.restart_lsn, coalesce(s.restart_lsn >= p_lsn, false)
    FROM pg_catalog.pg_replication_slots s
    WHERE s.slot_type = 'physical' AND NOT s.active
    ORDER BY 1
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.lease_epoch_standbys(pg_lsn);
DROP FUNCTION pgquota.lease_epoch_raise(bigint);
DROP FUNCTION pgquota.lease_epoch_prepare(bigint);
-- A pending epoch that a promotion made current is recorded already; one
-- still pending is dropped (00007 has no place for it).
-- pgquota.next_lease_token as 00007 created it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.next_lease_token() RETURNS bigint
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
-- pgquota.lease_epoch_now as 00007 created it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.lease_epoch_now() RETURNS bigint
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
DROP FUNCTION pgquota.lease_epoch_floor(bigint, bigint, bigint, bigint, bigint);
ALTER TABLE pgquota.lease_epoch
    DROP CONSTRAINT lease_epoch_pending_timeline,
    DROP CONSTRAINT lease_epoch_pending_range,
    DROP COLUMN pending_timeline,
    DROP COLUMN pending_epoch;
-- pgquota.system_identifier as 00007 created it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.system_identifier() RETURNS bigint
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
