-- Releases wake waiters only when someone waits.
--
-- Until now every release ran pg_notify. NOTIFY takes a database-wide lock
-- at commit (PreCommit_Notify locks the database object in
-- AccessExclusiveLock mode and holds it until the commit record is
-- flushed), so concurrent releases of DIFFERENT leases queued behind each
-- other's WAL flush: measured at 64 clients on this project's machine,
-- acquire + release ran 142/s with the pg_notify and 859/s without it,
-- pg_stat_activity showing the releasing backends in Lock:object (the
-- notify lock) in 94-95% of the samples (docs/scaling.md).
--
-- Now a waiter (AcquireWait, once its LISTEN is in place) registers a row
-- here before each attempt, and a release notifies only when a live
-- registration for its lease exists. No wake-up is lost, by this order:
--
--   waiter:  LISTEN (committed); lease_wait_register (takes the name's
--            advisory lock EXCLUSIVE, writes its row, commits); then the
--            acquire attempt, with a snapshot taken after that commit.
--   release: lease_notify_waiters, inside the release statement: takes the
--            same advisory lock SHARED, then reads the registrations with a
--            snapshot taken after it holds the lock; pg_notify when one is
--            live. The lock is held until the release commits.
--
-- The two lock modes conflict, so one of the two holds the lock first:
--   * the release: the registration waits until the release has committed,
--     so the waiter's attempt (after its registration) sees the release
--     and takes the lease; no notification is needed;
--   * the registration: the release waits until the registration has
--     committed, then sees it and notifies; the waiter has listened since
--     before registering, so it receives the notification if its attempt
--     did not already see the release.
-- Releases take the lock shared: they never wait for one another, only
-- for a registration of the same name (a short transaction). The advisory
-- locks are transaction-level (released at commit: no session state, fine
-- behind a transaction pooler). The fresh snapshot needs READ COMMITTED:
-- under REPEATABLE READ or SERIALIZABLE (ReleaseTx in such a transaction,
-- or default_transaction_isolation) a release always notifies, as before.
--
-- A registration lasts until `until` (the waiter refreshes it while it
-- waits and deletes it when the wait ends); a waiter that dies leaves a
-- row that only costs notifications until it expires. Registering removes
-- the name's expired rows.

-- +goose Up
CREATE TABLE pgquota.lease_waiter (
    name   text        NOT NULL,
    waiter text        NOT NULL,
    until  timestamptz NOT NULL,
    PRIMARY KEY (name, waiter),
    CONSTRAINT lease_waiter_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT lease_waiter_waiter_length CHECK (octet_length(waiter) BETWEEN 1 AND 255)
);

-- pgquota.lease_wait_lock_key is the advisory lock key that orders
-- registrations of waiters for lease p_name against its releases.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_wait_lock_key(p_name text) RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT hashtextextended('pgquota.lease_waiter:' || p_name, 0) $$;
-- +goose StatementEnd

-- pgquota.lease_wait_register registers (or refreshes) waiter p_waiter of
-- lease p_name until p_for from the database clock, and returns that
-- instant. Call it in a transaction of its own (it must commit before the
-- waiter's next acquire attempt), after LISTEN is in place.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_wait_register(p_name text, p_waiter text, p_for interval) RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_until timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(pgquota.lease_wait_lock_key(p_name));
    DELETE FROM pgquota.lease_waiter w WHERE w.name = p_name AND w.until <= pgquota.clock();
    v_until := pgquota.clock() + p_for;
    INSERT INTO pgquota.lease_waiter AS w (name, waiter, until)
    VALUES (p_name, p_waiter, v_until)
    ON CONFLICT (name, waiter) DO UPDATE SET until = excluded.until;
    RETURN v_until;
END
$$;
-- +goose StatementEnd

-- pgquota.lease_notify_waiters runs pg_notify('pgquota_lease', p_name)
-- when a waiter of lease p_name is registered (or when the transaction is
-- not READ COMMITTED), and reports whether it did. The release statement
-- calls it for its lease; see the header for why no wake-up is lost.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_notify_waiters(p_name text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('pgquota_lease', p_name);
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(pgquota.lease_wait_lock_key(p_name));
    -- A new statement: a snapshot taken after the lock is held.
    IF EXISTS (SELECT 1 FROM pgquota.lease_waiter w WHERE w.name = p_name AND w.until > pgquota.clock()) THEN
        PERFORM pg_notify('pgquota_lease', p_name);
        RETURN true;
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.lease_notify_waiters(text);
DROP FUNCTION pgquota.lease_wait_register(text, text, interval);
DROP FUNCTION pgquota.lease_wait_lock_key(text);
DROP TABLE pgquota.lease_waiter;
