-- The grant and revoke logic as SQL functions: ONE definition of each, for
-- the Go library (queries/usage.sql and queries/ledger.sql call them) and
-- for psql or any other language (docs/sql.md is their public
-- documentation). Every call is one statement and one round trip.
--
--   pgquota.grant(quota, member, amount, limit)        any kind of quota
--   pgquota.grant_keyed(scope, key, quota, member, amount, limit)
--   pgquota.revoke(quota, member, amount)              calendar quotas
--   pgquota.revoke_keyed(scope, key, quota, member, amount)
--   pgquota.compensate_grant(grant_id)                 a keyed grant's units back
--
-- Internal helpers (not part of the interface, their signatures may
-- change): grant_args_check, grant_target, grant_counter, revoke_counter.
--
-- Why a calendar grant is exact (the limit holds under any number of
-- concurrent callers, with no lock taken beforehand): grant_counter raises
-- an existing counter with a plain UPDATE whose WHERE clause holds the
-- guard used + amount <= limit. Under READ COMMITTED, when a concurrent
-- grant changed the row, PostgreSQL waits for it, then re-checks the WHERE
-- clause against the newest committed version (the manual's "EvalPlanQual"
-- rule, section 13.2.1), so the limit holds. When the UPDATE finds no row
-- to raise, the counter is inserted; when a concurrent first grant inserted
-- it meanwhile, INSERT .. ON CONFLICT DO UPDATE locks that row and its
-- WHERE re-checks the guard on the newest version. A guard that does not
-- fire writes nothing: that is a denial, and the denial's used is read
-- again with a fresh snapshot (pgquota.usage_used_fresh) so that it
-- includes the grant that won the race. The limit and the window are read
-- before; they are inputs to the guard, never the guard. Every statement
-- of a VOLATILE PL/pgSQL function takes a new snapshot in READ COMMITTED
-- (the manual, "Function Volatility Categories"), which the INSERT and the
-- fresh read rely on. Under REPEATABLE READ or SERIALIZABLE a concurrent
-- change of the row fails the call with SQLSTATE 40001 instead (retry the
-- transaction).
--
-- Keyed calls (idempotency keys) are exact as queries/ledger.sql's header
-- describes: the ledger row is inserted first with ON CONFLICT DO NOTHING,
-- so of any number of copies of one key exactly one inserts it and goes on
-- to write; the others write nothing and report the key's grant id
-- (prior_grant_id, read with a fresh snapshot). The ledger row, the counter
-- write and the stored outcome are one function call, so one statement:
-- they commit or roll back together. Locks are always taken in the same
-- order (ledger key, then counter row), so keyed calls cannot deadlock
-- each other.
--
-- Durability: every path that writes calls pgquota.durable_commit()
-- (00007) first, which raises the transaction's synchronous_commit from off
-- to on, so a call that reported success survives a crash.
--
-- Bad input (a NULL or empty quota, member, scope or key, or one longer
-- than 255 bytes; an amount below 1; a negative limit; a grant id below 1)
-- raises SQLSTATE 22023 (invalid_parameter_value) with a message naming the
-- parameter; nothing is written.

-- +goose Up

-- pgquota.grant_args_check raises 22023 naming the first bad argument of
-- function p_fn. NULL arguments that p_fn does not take are not checked:
-- p_scope and p_key are checked when p_keyed, p_limit when not NULL.
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_args_check(
    p_fn text, p_keyed boolean, p_scope text, p_key text,
    p_quota text, p_member text, p_amount bigint, p_limit bigint
) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    v_name  text;
    v_value text;
BEGIN
    IF p_keyed AND coalesce(octet_length(p_scope), 0) NOT BETWEEN 1 AND 255 THEN
        v_name := 'p_scope'; v_value := p_scope;
    ELSIF p_keyed AND coalesce(octet_length(p_key), 0) NOT BETWEEN 1 AND 255 THEN
        v_name := 'p_key'; v_value := p_key;
    ELSIF coalesce(octet_length(p_quota), 0) NOT BETWEEN 1 AND 255 THEN
        v_name := 'p_quota'; v_value := p_quota;
    ELSIF coalesce(octet_length(p_member), 0) NOT BETWEEN 1 AND 255 THEN
        v_name := 'p_member'; v_value := p_member;
    END IF;
    IF v_name IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: %s must be 1 to 255 bytes, got %s', p_fn, v_name,
                             coalesce(octet_length(v_value) || ' bytes', 'NULL'));
    END IF;
    -- No control characters, as quota/validate.go checkName and
    -- pgquota.claim_check_name (00015) require.
    IF p_keyed AND p_scope ~ '[\x01-\x1f\x7f-\x9f]' THEN
        v_name := 'p_scope';
    ELSIF p_keyed AND p_key ~ '[\x01-\x1f\x7f-\x9f]' THEN
        v_name := 'p_key';
    ELSIF p_quota ~ '[\x01-\x1f\x7f-\x9f]' THEN
        v_name := 'p_quota';
    ELSIF p_member ~ '[\x01-\x1f\x7f-\x9f]' THEN
        v_name := 'p_member';
    END IF;
    IF v_name IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: %s must not contain control characters', p_fn, v_name);
    END IF;
    IF p_amount IS NULL OR p_amount < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: p_amount must be at least 1, got %s', p_fn, coalesce(p_amount::text, 'NULL'));
    END IF;
    IF p_limit < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: p_limit must be at least 0 (or NULL: the member''s or the quota''s limit), got %s', p_fn, p_limit);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgquota.grant_target reads what a grant of p_quota for p_member is
-- decided against, at the database clock's instant o_at: whether the quota
-- exists, its kind, the limit (p_limit, else the member's override, else
-- the quota's default; NULL when none applies) and, for the calendar kinds,
-- the window holding o_at. Internal.
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_target(
    p_quota text, p_member text, p_limit bigint,
    OUT o_found boolean, OUT o_kind text, OUT o_limit bigint,
    OUT o_start timestamptz, OUT o_end timestamptz, OUT o_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    r record;
BEGIN
    o_at := pgquota.clock();
    SELECT q.window_unit, q.time_zone, coalesce(p_limit, o.limit_value, q.default_limit) AS lim
    INTO r
    FROM pgquota.quota q
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = p_member
    WHERE q.name = p_quota;
    o_found := FOUND;
    IF NOT o_found THEN
        RETURN;
    END IF;
    o_kind := r.window_unit;
    o_limit := r.lim;
    IF o_kind IN ('none', 'hour', 'day', 'week', 'month') THEN
        o_start := pgquota.window_start(o_kind, r.time_zone, o_at);
        o_end := pgquota.window_end(o_kind, r.time_zone, o_at);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgquota.grant_counter grants p_amount units on the counter of window
-- [p_start, p_end) of a calendar quota of kind p_kind, if used + p_amount
-- <= p_limit (not NULL) holds on the newest version of the counter (see
-- the header for why). o_used is the counter after a grant, or read with a
-- fresh snapshot after a denial. o_retry_us and o_reset_us are as
-- pgquota.grant_limits (00011) defines them for its calendar kinds, at
-- instant p_at: the wait until the grant can succeed (0 when granted, -1
-- when no wait helps: an amount above the limit, or a lifetime counter)
-- and until the counter is empty again (the window's end; -1 for a
-- lifetime counter), in microseconds, rounded up. Internal.
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_counter(
    p_quota text, p_member text, p_amount bigint, p_kind text, p_limit bigint,
    p_start timestamptz, p_end timestamptz, p_at timestamptz,
    OUT o_granted boolean, OUT o_used bigint, OUT o_retry_us bigint, OUT o_reset_us bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM pgquota.durable_commit();
    -- One statement for both cases (a member's first grant of a window
    -- costs no second statement): upd raises an existing counter, ins
    -- inserts one missing from the statement's snapshot (ON CONFLICT DO
    -- UPDATE re-checks the guard on the newest version when a concurrent
    -- first grant inserted it meanwhile). At most one of them returns a row.
    WITH upd AS (
        UPDATE pgquota.usage AS u
        SET used = u.used + p_amount,
            updated_at = p_at
        WHERE u.quota_name = p_quota
          AND u.member = p_member
          AND u.window_start = p_start
          AND u.window_end = p_end
          AND u.used + p_amount <= p_limit
        RETURNING u.used
    ), ins AS (
        INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
        SELECT p_quota, p_member, p_start, p_end, p_amount, p_at
        WHERE p_amount <= p_limit
          AND NOT EXISTS (
              SELECT 1 FROM pgquota.usage x
              WHERE x.quota_name = p_quota
                AND x.member = p_member
                AND x.window_start = p_start
                AND x.window_end = p_end
          )
        ON CONFLICT ON CONSTRAINT usage_pkey DO UPDATE
        SET used = u.used + excluded.used,
            updated_at = excluded.updated_at
        WHERE u.used + excluded.used <= p_limit
        RETURNING u.used
    )
    SELECT g.used INTO o_used
    FROM (SELECT upd.used FROM upd UNION ALL SELECT ins.used FROM ins) g;
    o_granted := o_used IS NOT NULL;
    IF o_granted THEN
        o_retry_us := 0;
    ELSE
        o_used := pgquota.usage_used_fresh(p_quota, p_member, p_start, p_end);
        o_retry_us := CASE WHEN p_amount > p_limit OR p_kind = 'none' THEN -1
                           ELSE ceil(extract(epoch FROM (p_end - p_at)) * 1000000)::bigint END;
    END IF;
    o_reset_us := CASE WHEN p_kind = 'none' THEN -1
                       ELSE ceil(extract(epoch FROM (p_end - p_at)) * 1000000)::bigint END;
END
$$;
-- +goose StatementEnd

-- pgquota.revoke_counter gives back up to p_amount units of the counter of
-- window [p_start, p_end), never below zero. The counter row is locked
-- first (a locking read returns the newest committed version) and the
-- update that follows writes that locked version, so o_before and o_after
-- describe the same row version and the units given back are o_before -
-- o_after. Both are 0 when the counter does not exist (nothing written).
-- Internal.
-- +goose StatementBegin
CREATE FUNCTION pgquota.revoke_counter(
    p_quota text, p_member text, p_amount bigint,
    p_start timestamptz, p_end timestamptz, p_at timestamptz,
    OUT o_before bigint, OUT o_after bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM pgquota.durable_commit();
    SELECT u.used INTO o_before
    FROM pgquota.usage u
    WHERE u.quota_name = p_quota
      AND u.member = p_member
      AND u.window_start = p_start
      AND u.window_end = p_end
    FOR UPDATE;
    IF NOT FOUND THEN
        o_before := 0;
        o_after := 0;
        RETURN;
    END IF;
    UPDATE pgquota.usage AS u
    SET used = u.used - least(u.used, p_amount),
        updated_at = p_at
    WHERE u.quota_name = p_quota
      AND u.member = p_member
      AND u.window_start = p_start
      AND u.window_end = p_end
    RETURNING u.used INTO o_after;
END
$$;
-- +goose StatementEnd

-- pgquota.grant grants p_amount units of quota p_quota to p_member, or
-- denies them, for a quota of ANY kind: the calendar kinds (none, hour,
-- day, week, month) by the conditional update of grant_counter, the kinds
-- rate, fixed and rolling through pgquota.grant_limits (00011). p_limit,
-- when not NULL, is the limit of this call (else the member's override,
-- else the quota's default). Exactly one row comes back:
--   * found = false: no such quota; has_limit = false: no limit applies;
--     decided_at IS NULL: nothing was decided nor written (those two, or a
--     rolling quota whose limit is above 10,000, or a shaped quota without
--     its shape row);
--   * otherwise granted says whether the units were granted; used is the
--     counter after the call (read with a fresh snapshot after a denial;
--     for a rate, burst - remaining; for a rolling window, the units of
--     the last period), limit_value the limit decided against, remaining
--     what is left, window_start/window_end the counter's window
--     (-infinity/infinity for kind none, NULL for rate and rolling),
--     retry_after_us and reset_after_us the waits in microseconds after
--     decided_at (until the same grant can succeed: 0 when granted, -1 when
--     no wait helps; until the quota is at its full limit again, -1 never),
--     decided_at the pgquota.clock() instant the decision was taken at;
--     burst and period_us the rate's burst and the rate's period or the
--     fixed or rolling window's length (0 for the calendar kinds).
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant(p_quota text, p_member text, p_amount bigint DEFAULT 1, p_limit bigint DEFAULT NULL)
RETURNS TABLE (
    found boolean, kind text, has_limit boolean, granted boolean, used bigint, limit_value bigint,
    remaining bigint, window_start timestamptz, window_end timestamptz,
    retry_after_us bigint, reset_after_us bigint, decided_at timestamptz,
    burst bigint, period_us bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    t record;
    c record;
BEGIN
    PERFORM pgquota.grant_args_check('pgquota.grant', false, NULL, NULL, p_quota, p_member, p_amount, p_limit);
    t := pgquota.grant_target(p_quota, p_member, p_limit);
    IF t.o_found AND t.o_kind NOT IN ('none', 'hour', 'day', 'week', 'month') THEN
        RETURN QUERY
            SELECT g.found, g.kind, g.limit_value IS NOT NULL, g.granted, g.used, coalesce(g.limit_value, 0),
                   g.remaining, g.window_start, g.window_end, g.retry_after_us, g.reset_after_us,
                   CASE WHEN g.decided THEN g.decided_at END, coalesce(g.burst, 0), coalesce(g.period_us, 0)
            FROM pgquota.grant_limits(ARRAY[p_quota], p_member, p_amount, p_limit) g;
        RETURN;
    END IF;
    IF NOT t.o_found OR t.o_limit IS NULL THEN
        RETURN QUERY SELECT t.o_found, t.o_kind, false, false, 0::bigint, 0::bigint, 0::bigint,
                            t.o_start, t.o_end, 0::bigint, 0::bigint, NULL::timestamptz, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    c := pgquota.grant_counter(p_quota, p_member, p_amount, t.o_kind, t.o_limit, t.o_start, t.o_end, t.o_at);
    RETURN QUERY SELECT true, t.o_kind, true, c.o_granted, c.o_used, t.o_limit, greatest(t.o_limit - c.o_used, 0),
                        t.o_start, t.o_end, c.o_retry_us, c.o_reset_us, t.o_at, 0::bigint, 0::bigint;
END
$$;
-- +goose StatementEnd

-- pgquota.grant_keyed is pgquota.grant for a calendar quota with an
-- idempotency key (p_key, unique within p_scope): the ledger row, the
-- counter write and the stored outcome are one call. Exactly one row comes
-- back:
--   * prior_grant_id > 0: the key was taken before (by this request or
--     another: compare pgquota.ledger_entry's row of that grant id with
--     yours); nothing was written, the stored outcome is in
--     pgquota.ledger_entry;
--   * else found = false, has_limit = false, or kind rate, fixed or
--     rolling (which record no keyed grants): nothing was written, grant_id
--     is 0;
--   * else grant_id is the new ledger entry, and the other columns are
--     those of pgquota.grant (the stored outcome holds granted, used,
--     limit_value, the window and decided_at).
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_keyed(
    p_scope text, p_key text, p_quota text, p_member text, p_amount bigint DEFAULT 1, p_limit bigint DEFAULT NULL
)
RETURNS TABLE (
    found boolean, kind text, has_limit boolean, limit_value bigint,
    window_start timestamptz, window_end timestamptz, grant_id bigint, granted boolean, used bigint,
    prior_grant_id bigint, retry_after_us bigint, reset_after_us bigint, decided_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    t    record;
    c    record;
    v_id bigint;
BEGIN
    PERFORM pgquota.grant_args_check('pgquota.grant_keyed', true, p_scope, p_key, p_quota, p_member, p_amount, p_limit);
    t := pgquota.grant_target(p_quota, p_member, p_limit);
    IF t.o_found AND t.o_limit IS NOT NULL AND t.o_kind IN ('none', 'hour', 'day', 'week', 'month') THEN
        PERFORM pgquota.durable_commit();
        INSERT INTO pgquota.ledger AS l (scope, idempotency_key, operation, target, member, amount, request_limit, created_at)
        VALUES (p_scope, p_key, 'grant', p_quota, p_member, p_amount, p_limit, t.o_at)
        ON CONFLICT ON CONSTRAINT ledger_key DO NOTHING
        RETURNING l.grant_id INTO v_id;
    END IF;
    IF v_id IS NULL THEN
        RETURN QUERY SELECT t.o_found, t.o_kind, t.o_limit IS NOT NULL, coalesce(t.o_limit, 0), t.o_start, t.o_end,
                            0::bigint, false, 0::bigint, pgquota.ledger_key_fresh(p_scope, p_key),
                            0::bigint, 0::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    c := pgquota.grant_counter(p_quota, p_member, p_amount, t.o_kind, t.o_limit, t.o_start, t.o_end, t.o_at);
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, limit_value, window_start, window_end, decided_at)
    VALUES (v_id, c.o_granted, c.o_used, t.o_limit, t.o_start, t.o_end, t.o_at);
    RETURN QUERY SELECT true, t.o_kind, true, t.o_limit, t.o_start, t.o_end, v_id, c.o_granted, c.o_used,
                        0::bigint, c.o_retry_us, c.o_reset_us, t.o_at;
END
$$;
-- +goose StatementEnd

-- pgquota.revoke gives back up to p_amount units of p_member's counter of
-- calendar quota p_quota in the current window, never below zero. Exactly
-- one row comes back: found = false (no such quota) or a kind rate, fixed
-- or rolling (whose grants cannot be revoked): nothing was written and
-- decided_at is NULL; else used_before and used_after are the counter
-- before and after (0 when the member has no counter in this window),
-- revoked = used_before - used_after, decided_at the clock's instant.
-- +goose StatementBegin
CREATE FUNCTION pgquota.revoke(p_quota text, p_member text, p_amount bigint DEFAULT 1)
RETURNS TABLE (
    found boolean, kind text, window_start timestamptz, window_end timestamptz,
    used_before bigint, used_after bigint, revoked bigint, decided_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    t record;
    c record;
BEGIN
    PERFORM pgquota.grant_args_check('pgquota.revoke', false, NULL, NULL, p_quota, p_member, p_amount, NULL);
    t := pgquota.grant_target(p_quota, p_member, NULL);
    IF NOT t.o_found OR t.o_kind NOT IN ('none', 'hour', 'day', 'week', 'month') THEN
        RETURN QUERY SELECT t.o_found, t.o_kind, NULL::timestamptz, NULL::timestamptz,
                            0::bigint, 0::bigint, 0::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    c := pgquota.revoke_counter(p_quota, p_member, p_amount, t.o_start, t.o_end, t.o_at);
    RETURN QUERY SELECT true, t.o_kind, t.o_start, t.o_end, c.o_before, c.o_after, c.o_before - c.o_after, t.o_at;
END
$$;
-- +goose StatementEnd

-- pgquota.revoke_keyed is pgquota.revoke with an idempotency key, as
-- pgquota.grant_keyed is pgquota.grant's: prior_grant_id > 0 when the key
-- was taken before (nothing written); grant_id 0 when the quota does not
-- exist or is not a calendar quota (nothing written); else grant_id is the
-- new ledger entry, used the counter after and revoked the units given
-- back (stored as the entry's outcome).
-- +goose StatementBegin
CREATE FUNCTION pgquota.revoke_keyed(p_scope text, p_key text, p_quota text, p_member text, p_amount bigint DEFAULT 1)
RETURNS TABLE (
    found boolean, kind text, window_start timestamptz, window_end timestamptz,
    grant_id bigint, used bigint, revoked bigint, prior_grant_id bigint, decided_at timestamptz
)
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    t    record;
    c    record;
    v_id bigint;
BEGIN
    PERFORM pgquota.grant_args_check('pgquota.revoke_keyed', true, p_scope, p_key, p_quota, p_member, p_amount, NULL);
    t := pgquota.grant_target(p_quota, p_member, NULL);
    IF t.o_found AND t.o_kind IN ('none', 'hour', 'day', 'week', 'month') THEN
        PERFORM pgquota.durable_commit();
        INSERT INTO pgquota.ledger AS l (scope, idempotency_key, operation, target, member, amount, created_at)
        VALUES (p_scope, p_key, 'revoke', p_quota, p_member, p_amount, t.o_at)
        ON CONFLICT ON CONSTRAINT ledger_key DO NOTHING
        RETURNING l.grant_id INTO v_id;
    END IF;
    IF v_id IS NULL THEN
        RETURN QUERY SELECT t.o_found, t.o_kind, t.o_start, t.o_end, 0::bigint, 0::bigint, 0::bigint,
                            pgquota.ledger_key_fresh(p_scope, p_key), NULL::timestamptz;
        RETURN;
    END IF;
    c := pgquota.revoke_counter(p_quota, p_member, p_amount, t.o_start, t.o_end, t.o_at);
    INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, revoked, window_start, window_end, decided_at)
    VALUES (v_id, true, c.o_after, c.o_before - c.o_after, t.o_start, t.o_end, t.o_at);
    RETURN QUERY SELECT true, t.o_kind, t.o_start, t.o_end, v_id, c.o_after, c.o_before - c.o_after, 0::bigint, t.o_at;
END
$$;
-- +goose StatementEnd

-- pgquota.compensate_grant gives back the units of keyed grant p_grant_id
-- to the counter of the grant's own window (not the current one), at most
-- once, never more than the grant took and never below zero. No row comes
-- back when p_grant_id is not a keyed grant (or was reaped).
--
-- The counter row is locked first (a locking read returns its newest
-- version); then the compensation is recorded in the grant's outcome row,
-- guarded by compensated_at IS NULL in the WHERE clause of that row. Of
-- concurrent compensations of one grant, the first to lock the counter row
-- marks the outcome; the others wait for it, and under READ COMMITTED their
-- UPDATE re-checks the guard on the newest version (section 13.2.1), finds
-- the grant compensated and does nothing (revoked_now = false: the stored
-- compensation is in pgquota.ledger_entry). Units are given back only by
-- the call that marked the grant. Locks: counter row, then outcome row; a
-- keyed grant takes the ledger key, then the counter row, and never waits
-- for an outcome row, so there is no cycle.
--
-- A denied grant is marked with 0 units. written_used is the counter as
-- written (-1 when nothing was written): it equals compensated_used.
-- +goose StatementBegin
CREATE FUNCTION pgquota.compensate_grant(p_grant_id bigint)
RETURNS TABLE (
    grant_id bigint, target text, member text, amount bigint, granted boolean,
    window_start timestamptz, window_end timestamptz, revoked_now boolean,
    compensated bigint, compensated_used bigint, compensated_at timestamptz, written_used bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    g      record;
    v_cur  bigint;
    v_comp bigint;
    v_left bigint;
    v_at   timestamptz;
    v_used bigint;
BEGIN
    IF p_grant_id IS NULL OR p_grant_id < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgquota.compensate_grant: p_grant_id must be at least 1, got %s', coalesce(p_grant_id::text, 'NULL'));
    END IF;
    SELECT l.grant_id AS id, l.target AS quota, l.member AS who, l.amount AS units, o.granted AS ok,
           o.window_start AS ws, o.window_end AS we
    INTO g
    FROM pgquota.ledger l
    JOIN pgquota.ledger_outcome o ON o.grant_id = l.grant_id
    WHERE l.grant_id = p_grant_id
      AND l.operation = 'grant';
    IF g.id IS NULL THEN
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    IF g.ok THEN
        SELECT u.used INTO v_cur
        FROM pgquota.usage u
        WHERE u.quota_name = g.quota AND u.member = g.who
          AND u.window_start = g.ws AND u.window_end = g.we
        FOR UPDATE;
    END IF;
    UPDATE pgquota.ledger_outcome AS o
    SET compensated = least(coalesce(v_cur, 0), g.units),
        compensated_used = coalesce(v_cur, 0) - least(coalesce(v_cur, 0), g.units),
        compensated_at = pgquota.clock()
    WHERE o.grant_id = g.id
      AND o.compensated_at IS NULL
    RETURNING o.compensated, o.compensated_used, o.compensated_at INTO v_comp, v_left, v_at;
    IF v_at IS NOT NULL AND v_comp > 0 THEN
        -- least(): kept from the single-statement form this function
        -- replaces (queries/ledger.sql, LedgerRevokeGrant), where
        -- PostgreSQL computed the new row from the version in the
        -- statement's snapshot, which could hold fewer units than the
        -- locked one, and checked it against usage_used_nonnegative before
        -- re-evaluating SET on the locked version. Here the UPDATE takes
        -- its snapshot after the lock (READ COMMITTED), so it reads the
        -- locked version, on which least() is v_comp itself (v_cur >=
        -- v_comp); least() keeps the write from failing the check should a
        -- snapshot ever predate the lock.
        UPDATE pgquota.usage AS u
        SET used = u.used - least(u.used, v_comp),
            updated_at = v_at
        WHERE u.quota_name = g.quota AND u.member = g.who
          AND u.window_start = g.ws AND u.window_end = g.we
        RETURNING u.used INTO v_used;
    END IF;
    RETURN QUERY SELECT g.id, g.quota, g.who, g.units, g.ok, g.ws, g.we, v_at IS NOT NULL,
                        coalesce(v_comp, 0), coalesce(v_left, 0), v_at, coalesce(v_used, -1);
END
$$;
-- +goose StatementEnd

-- The application role may call the functions (default privileges cover
-- them when this runs as the owner that ran 00010; this covers a migration
-- run as another owner).
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
DROP FUNCTION pgquota.compensate_grant(bigint);
DROP FUNCTION pgquota.revoke_keyed(text, text, text, text, bigint);
DROP FUNCTION pgquota.revoke(text, text, bigint);
DROP FUNCTION pgquota.grant_keyed(text, text, text, text, bigint, bigint);
DROP FUNCTION pgquota.grant(text, text, bigint, bigint);
DROP FUNCTION pgquota.revoke_counter(text, text, bigint, timestamptz, timestamptz, timestamptz);
DROP FUNCTION pgquota.grant_counter(text, text, bigint, text, bigint, timestamptz, timestamptz, timestamptz);
DROP FUNCTION pgquota.grant_target(text, text, bigint);
DROP FUNCTION pgquota.grant_args_check(text, boolean, text, text, text, text, bigint, bigint);
