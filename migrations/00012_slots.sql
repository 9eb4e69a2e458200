-- Concurrency limits (semaphores): at most N holders at once, each holding
-- a slot with its own fencing token and TTL (issue 12, item 4; the peers
-- are Consul's `lock -n` and Curator's InterProcessSemaphoreV2).
--
-- A slot IS a lease: slot i of semaphore S is the row of pgquota.lease
-- named pgquota.slot_lease_name(S, i) = 'slot:' || S || ':' || i. So every
-- lease feature applies to a slot unchanged: its token comes from
-- pgquota.next_lease_token (00007), renew and release are the lease's own
-- statements, keepalive renews it, fenced writes check it (fence_admit and
-- the guard's lease check, 00003 and 00006, with the slot's lease name as
-- the lease and, by default, as the fence resource), the reaper deletes it
-- once expired. What the lease table cannot do by itself is count holders
-- across rows: that is the acquire function below, serialized per
-- semaphore on its row of pgquota.semaphore.
--
-- Lease names starting with 'slot:' belong to semaphores: taking one
-- through the lease API (a new token on such a row outside
-- pgquota.slot_acquire) is refused with SQLSTATE PQ012, so the count
-- cannot be bypassed.

-- +goose Up
-- One row per semaphore. Every acquire locks it (FOR UPDATE) before
-- counting, so acquirers of one semaphore take turns and each counts what
-- the previous one committed. slot_limit is the limit the last acquire
-- stated (for people reading `pgquota slot show`); slots is the highest
-- limit ever stated, so the count looks at every slot that can be held.
CREATE TABLE pgquota.semaphore (
    name         text        NOT NULL PRIMARY KEY,
    slot_limit   integer     NOT NULL,
    slots        integer     NOT NULL,
    acquisitions bigint      NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    CONSTRAINT semaphore_name_length CHECK (octet_length(name) BETWEEN 1 AND 240),
    CONSTRAINT semaphore_slot_limit_range CHECK (slot_limit BETWEEN 1 AND 1000),
    CONSTRAINT semaphore_slots_range CHECK (slots BETWEEN slot_limit AND 1000)
);

-- pgquota.slot_lease_name is the lease name of slot p_slot (0-based) of
-- semaphore p_name. The index is the text after the last colon.
-- +goose StatementBegin
CREATE FUNCTION pgquota.slot_lease_name(p_name text, p_slot integer) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 'slot:' || p_name || ':' || p_slot::text $$;
-- +goose StatementEnd

-- pgquota.slot_acquire takes a slot of semaphore p_name for p_ttl when
-- fewer than p_limit slots are held, by the database clock, or returns why
-- not. One call, one transaction (the caller's). Raises 22023 for bad
-- input (empty or long name, limit outside 1..1000, holder or attempt
-- empty, ttl not positive), before any write.
--
-- Why the limit holds under any concurrency:
--   * The semaphore's row is locked FOR UPDATE first (created when
--     missing): acquirers of one semaphore take turns, and the lock is
--     held until the acquirer's transaction ends.
--   * Every later query runs with a fresh snapshot (a VOLATILE plpgsql
--     function, READ COMMITTED), so the count of held slots includes every
--     acquire committed before the lock was granted. A holder's own
--     statements (renew, release) never make a slot held that was not:
--     renew extends only a slot still held, release ends one. Expiry only
--     lowers the count. So between the count and the commit the number of
--     holders can only fall.
--   * Under REPEATABLE READ or SERIALIZABLE the snapshot is the
--     transaction's: an acquire committed after it updated the semaphore
--     row, so locking that row fails with 40001 (a serialization failure,
--     retried by pgquota where it owns the transaction) instead of
--     counting from an old snapshot.
--   * A slot is taken only when its row is absent or expired by the
--     clock read after its row lock (FOR UPDATE SKIP LOCKED: a slot whose
--     row another session holds, a stale holder's fenced write keeping it
--     FOR SHARE, is passed over rather than waited for, so one paused
--     writer never blocks a whole semaphore), with a new token, and the
--     fence resource of the slot's lease name is raised to that token in
--     the same transaction, as a lease acquire does.
--   * Only slots 0..p_limit-1 are taken, and only while the held count
--     (over every slot ever used) is below p_limit: with a lowered limit,
--     the holders of higher slots keep them (renewals work) until they
--     release or expire, and nobody new gets in until fewer than the new
--     limit hold.
--
-- A repeated call with an attempt that holds a slot of the semaphore
-- returns that slot unchanged (a retry after a lost reply).
--
-- The row: taken; slot (-1 when not taken) and its lease columns ('', 0
-- and NULL when not taken); db_now;
-- holders, the number held after the call; next_expiry, when not taken,
-- the earliest expiry among the holders (NULL when a free slot was only
-- locked by another session).
-- +goose StatementBegin
CREATE FUNCTION pgquota.slot_acquire(p_name text, p_limit integer, p_holder text, p_attempt text, p_ttl interval)
    RETURNS TABLE (taken boolean, slot integer, lease_name text, holder text, attempt text, token bigint,
                   acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz,
                   db_now timestamptz, holders integer, next_expiry timestamptz)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_sem   pgquota.semaphore;
    v_row   pgquota.lease;
    v_at    timestamptz;
    v_held  integer;
    v_next  timestamptz;
    v_slot  text;
    v_token bigint;
    v_found boolean;
BEGIN
    IF p_name IS NULL OR octet_length(p_name) NOT BETWEEN 1 AND 240 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pgquota: slot_acquire: the semaphore name must be 1 to 240 bytes';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota: slot_acquire: the limit must be 1 to 1000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    IF p_holder IS NULL OR p_holder = '' OR p_attempt IS NULL OR p_attempt = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pgquota: slot_acquire: the holder and the attempt must not be empty';
    END IF;
    IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota: slot_acquire: the ttl must be positive, got %s', coalesce(p_ttl::text, 'NULL'));
    END IF;
    PERFORM pgquota.durable_commit();

    -- Before any lock, from the statement's snapshot: a retry of an
    -- attempt that holds a slot gets it back, and a semaphore full at the
    -- limit it was last given answers "full" without a lock and without a
    -- write. Both are safe without the lock: the attempt's slot is its
    -- own; and this count only ever decides a refusal, never a take: it
    -- may miss a release committed since the snapshot (a refusal that
    -- the caller retries), and when it misses an acquire and finds room,
    -- the locked path below counts again. Waiters poll here without
    -- queueing on the semaphore's row.
    v_at := pgquota.clock();
    SELECT * INTO v_sem FROM pgquota.semaphore s WHERE s.name = p_name;
    IF FOUND THEN
        SELECT l.* INTO v_row
        FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
        JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
        WHERE l.attempt = p_attempt AND l.expires_at > v_at
        LIMIT 1;
        v_found := FOUND;
        SELECT count(*), min(l.expires_at) INTO v_held, v_next
        FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
        JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
        WHERE l.expires_at > v_at;
        IF v_found THEN
            RETURN QUERY SELECT true, substring(v_row.name FROM '[0-9]+$')::integer, v_row.name, v_row.holder, v_row.attempt,
                                v_row.token, v_row.acquired_at, v_row.renewed_at, v_row.expires_at, v_at, v_held,
                                NULL::timestamptz;
            RETURN;
        END IF;
        IF v_held >= p_limit AND v_sem.slot_limit = p_limit THEN
            RETURN QUERY SELECT false, -1, ''::text, ''::text, ''::text, 0::bigint, NULL::timestamptz,
                                NULL::timestamptz, NULL::timestamptz, v_at, v_held, v_next;
            RETURN;
        END IF;
    END IF;

    LOOP
        SELECT * INTO v_sem FROM pgquota.semaphore s WHERE s.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO pgquota.semaphore (name, slot_limit, slots, created_at, updated_at)
        VALUES (p_name, p_limit, p_limit, pgquota.clock(), pgquota.clock())
        ON CONFLICT (name) DO NOTHING;
    END LOOP;

    v_at := pgquota.clock();
    -- The same attempt again (committed while this call waited for the
    -- lock): its slot, unchanged.
    SELECT l.* INTO v_row
    FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
    JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
    WHERE l.attempt = p_attempt AND l.expires_at > v_at
    LIMIT 1;
    IF FOUND THEN
        SELECT count(*) INTO v_held
        FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
        JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
        WHERE l.expires_at > v_at;
        RETURN QUERY SELECT true, substring(v_row.name FROM '[0-9]+$')::integer, v_row.name, v_row.holder, v_row.attempt,
                            v_row.token, v_row.acquired_at, v_row.renewed_at, v_row.expires_at, v_at, v_held,
                            NULL::timestamptz;
        RETURN;
    END IF;

    SELECT count(*), min(l.expires_at) INTO v_held, v_next
    FROM generate_series(0, greatest(v_sem.slots, p_limit) - 1) g(i)
    JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(p_name, g.i)
    WHERE l.expires_at > v_at;

    IF v_held < p_limit THEN
        FOR i IN 0 .. p_limit - 1 LOOP
            v_slot := pgquota.slot_lease_name(p_name, i);
            SELECT * INTO v_row FROM pgquota.lease l WHERE l.name = v_slot FOR UPDATE SKIP LOCKED;
            v_found := FOUND;
            IF NOT v_found THEN
                CONTINUE WHEN EXISTS (SELECT 1 FROM pgquota.lease l WHERE l.name = v_slot);
                -- Absent. The lease acquirers' advisory lock on the name
                -- (queries/lease.sql), which the reaper also tries.
                PERFORM pg_advisory_xact_lock(hashtextextended('pgquota.lease:' || v_slot, 0));
            END IF;
            v_at := pgquota.clock();
            CONTINUE WHEN v_found AND v_row.expires_at > v_at;
            v_token := pgquota.next_lease_token();
            v_at := pgquota.clock();
            PERFORM set_config('pgquota.slot_taking', v_slot, true);
            IF v_found THEN
                UPDATE pgquota.lease l
                SET holder = p_holder, attempt = p_attempt, token = v_token,
                    acquired_at = v_at, renewed_at = v_at, expires_at = v_at + p_ttl
                WHERE l.name = v_slot
                RETURNING l.* INTO v_row;
            ELSE
                INSERT INTO pgquota.lease AS l (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
                VALUES (v_slot, p_holder, p_attempt, v_token, v_at, v_at, v_at + p_ttl)
                ON CONFLICT (name) DO NOTHING
                RETURNING l.* INTO v_row;
                v_found := FOUND;
            END IF;
            PERFORM set_config('pgquota.slot_taking', '', true);
            -- Inserted meanwhile: only the guarded lease API could, and it
            -- is refused (slot_lease_guard); pass over it all the same.
            CONTINUE WHEN NOT v_found;
            INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
            VALUES (v_slot, v_token, v_at)
            ON CONFLICT (resource) DO UPDATE
            SET max_token = excluded.max_token, updated_at = excluded.updated_at
            WHERE f.max_token < excluded.max_token;
            UPDATE pgquota.semaphore s
            SET slot_limit = p_limit, slots = greatest(s.slots, p_limit),
                acquisitions = s.acquisitions + 1, updated_at = v_at
            WHERE s.name = p_name;
            RETURN QUERY SELECT true, i, v_row.name, v_row.holder, v_row.attempt, v_row.token, v_row.acquired_at,
                                v_row.renewed_at, v_row.expires_at, pgquota.clock(), v_held + 1, NULL::timestamptz;
            RETURN;
        END LOOP;
        -- Fewer than p_limit held, but every free slot's row was locked
        -- by another session.
        v_next := NULL;
    END IF;
    IF v_sem.slot_limit <> p_limit THEN
        UPDATE pgquota.semaphore s
        SET slot_limit = p_limit, slots = greatest(s.slots, p_limit), updated_at = pgquota.clock()
        WHERE s.name = p_name;
    END IF;
    RETURN QUERY SELECT false, -1, ''::text, ''::text, ''::text, 0::bigint, NULL::timestamptz,
                        NULL::timestamptz, NULL::timestamptz, pgquota.clock(), v_held, v_next;
END
$$;
-- +goose StatementEnd

-- pgquota.slot_lease_guard refuses to give a slot's lease row a new token
-- (an insert, or an update that changes the token) outside
-- pgquota.slot_acquire: a lease acquire of a 'slot:' name would bypass the
-- semaphore's count. SQLSTATE PQ012. Renewals, releases, payloads and the
-- reaper's deletes keep the token and pass.
-- +goose StatementBegin
CREATE FUNCTION pgquota.slot_lease_guard() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    IF current_setting('pgquota.slot_taking', true) IS DISTINCT FROM NEW.name THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ012',
            MESSAGE = format('pgquota: lease %s is a semaphore slot: acquire it with AcquireSlot (pgquota slot acquire), not as a lease', NEW.name),
            DETAIL  = json_build_object('lease', NEW.name)::text;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER pgquota_slot_lease_insert
    BEFORE INSERT ON pgquota.lease
    FOR EACH ROW WHEN (starts_with(NEW.name, 'slot:'))
    EXECUTE FUNCTION pgquota.slot_lease_guard();
CREATE TRIGGER pgquota_slot_lease_take
    BEFORE UPDATE ON pgquota.lease
    FOR EACH ROW WHEN (starts_with(NEW.name, 'slot:') AND NEW.token IS DISTINCT FROM OLD.token)
    EXECUTE FUNCTION pgquota.slot_lease_guard();

-- The application role's privileges on the new objects (default privileges
-- cover them when the same owner ran 00010; this covers the other case).
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regrole('pgquota_app') IS NOT NULL THEN
        PERFORM pgquota.grant_app('pgquota_app');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Slot lease rows stay in pgquota.lease, as ordinary leases (their fence
-- rows keep their tokens).
DROP TRIGGER pgquota_slot_lease_take ON pgquota.lease;
DROP TRIGGER pgquota_slot_lease_insert ON pgquota.lease;
DROP FUNCTION pgquota.slot_lease_guard();
DROP FUNCTION pgquota.slot_acquire(text, integer, text, text, interval);
DROP FUNCTION pgquota.slot_lease_name(text, integer);
DROP TABLE pgquota.semaphore;
