-- pgquota's SQL interface from psql (docs/sql.md): grant, deny, a call's
-- limit, a member's override, keyed replay and key reuse, revoke, keyed
-- revoke, compensation, bad input (SQLSTATE 22023, nothing written) and a
-- rate quota granted through pgquota.grant. Every check fails the script
-- with RAISE EXCEPTION.

INSERT INTO pgquota.quota (name, window_unit, default_limit) VALUES
    ('calls', 'day', 3), ('life', 'none', 2), ('unlimited', 'hour', NULL), ('per-min', 'rate', 2);
INSERT INTO pgquota.quota_shape (quota_name, period_us) VALUES ('per-min', 60000000);
INSERT INTO pgquota.quota_override (quota_name, member, limit_value) VALUES ('calls', 'bob', 1);

-- Grant, deny, a call's limit, an override, an amount above the limit.
DO $$
DECLARE
    r record;
    v_to_end bigint;
BEGIN
    r := NULL;
    SELECT * INTO r FROM pgquota.grant('calls', 'alice', 2);
    v_to_end := ceil(extract(epoch FROM (r.window_end - r.decided_at)) * 1000)::bigint;
    IF NOT (r.found AND r.kind = 'day' AND r.has_limit AND r.granted AND r.used = 2 AND r.limit_value = 3
            AND r.remaining = 1 AND r.retry_after_ms = 0 AND r.reset_after_ms = v_to_end AND v_to_end > 0
            AND r.window_start = date_trunc('day', r.decided_at, 'UTC') AND r.window_end = r.window_start + interval '1 day'
            AND r.burst = 0 AND r.period_ms = 0) THEN
        RAISE EXCEPTION 'grant 2 of 3: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.grant('calls', 'alice', 2);
    v_to_end := ceil(extract(epoch FROM (r.window_end - r.decided_at)) * 1000)::bigint;
    IF r.granted OR r.used <> 2 OR r.remaining <> 1 OR r.retry_after_ms <> v_to_end OR r.reset_after_ms <> v_to_end THEN
        RAISE EXCEPTION 'denial: RetryAfter must be the time to the window end: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.grant('calls', 'alice', 1, 2);
    IF r.granted OR r.limit_value <> 2 OR r.used <> 2 THEN
        RAISE EXCEPTION 'a call''s limit of 2 denies the third unit: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.grant('calls', 'alice', 1, 10);
    IF NOT r.granted OR r.limit_value <> 10 OR r.used <> 3 THEN
        RAISE EXCEPTION 'a call''s limit of 10 grants it: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.grant('calls', 'bob');   -- amount defaults to 1
    IF NOT r.granted OR r.limit_value <> 1 OR r.used <> 1 THEN
        RAISE EXCEPTION 'bob''s override of 1 grants one unit: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.grant('calls', 'bob');
    IF r.granted OR r.remaining <> 0 THEN
        RAISE EXCEPTION 'bob''s second unit is denied: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.grant('calls', 'carol', 4);
    IF r.granted OR r.retry_after_ms <> -1 OR r.used <> 0 THEN
        RAISE EXCEPTION 'an amount above the limit never fits (retry_after_ms -1): %', r;
    END IF;

    PERFORM pgquota.grant('life', 'dan', 2);
    SELECT * INTO r FROM pgquota.grant('life', 'dan', 1);
    IF r.granted OR r.retry_after_ms <> -1 OR r.reset_after_ms <> -1 OR r.window_end <> 'infinity' THEN
        RAISE EXCEPTION 'a full lifetime counter: no wait helps: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.grant('unlimited', 'alice', 1);
    IF NOT r.found OR r.has_limit OR r.granted OR r.decided_at IS NOT NULL THEN
        RAISE EXCEPTION 'no limit applies: %', r;
    END IF;
    IF EXISTS (SELECT 1 FROM pgquota.usage WHERE quota_name IN ('nope', 'unlimited')) THEN
        RAISE EXCEPTION 'nothing is written without a quota or a limit';
    END IF;
    IF (SELECT used FROM pgquota.usage WHERE quota_name = 'calls' AND member = 'alice') <> 3 THEN
        RAISE EXCEPTION 'alice''s counter must hold 3';
    END IF;
END
$$;

-- Keyed grants: replay, key reuse, revoke, keyed revoke, compensation.
DO $$
DECLARE
    r   record;
    k   record;
    e   record;
    v_id bigint;
BEGIN
    SELECT * INTO k FROM pgquota.grant_keyed('orders', 'order-1', 'calls', 'erin', 2);
    IF NOT k.found OR k.grant_id < 1 OR NOT k.granted OR k.used <> 2 OR k.prior_grant_id <> 0 OR k.decided_at IS NULL THEN
        RAISE EXCEPTION 'keyed grant: %', k;
    END IF;
    v_id := k.grant_id;
    SELECT * INTO e FROM pgquota.ledger_entry WHERE grant_id = v_id;
    IF e.operation <> 'grant' OR NOT e.granted OR e.used <> 2 OR e.limit_value <> 3 OR e.decided_at <> k.decided_at THEN
        RAISE EXCEPTION 'stored outcome: %', e;
    END IF;

    SELECT * INTO r FROM pgquota.grant_keyed('orders', 'order-1', 'calls', 'erin', 2);
    IF r.prior_grant_id <> v_id OR r.grant_id <> 0 THEN
        RAISE EXCEPTION 'replay reports the first grant id: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.grant_keyed('orders', 'order-1', 'calls', 'erin', 1);
    IF r.prior_grant_id <> v_id THEN
        RAISE EXCEPTION 'key reuse reports the first grant id: %', r;
    END IF;
    IF (SELECT amount FROM pgquota.ledger_entry WHERE grant_id = r.prior_grant_id) = 1 THEN
        RAISE EXCEPTION 'the entry keeps the first request (amount 2), so the caller sees the reuse';
    END IF;
    IF (SELECT used FROM pgquota.usage WHERE quota_name = 'calls' AND member = 'erin') <> 2
       OR (SELECT count(*) FROM pgquota.ledger) <> 1 THEN
        RAISE EXCEPTION 'a replay and a reuse write nothing';
    END IF;

    SELECT * INTO r FROM pgquota.grant_keyed('orders', 'order-2', 'calls', 'erin', 2);
    IF r.granted OR r.grant_id < 1 OR r.used <> 2 OR r.retry_after_ms <= 0 THEN
        RAISE EXCEPTION 'a keyed denial is recorded too: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.revoke('calls', 'alice', 5);
    IF NOT r.found OR r.used_before <> 3 OR r.used_after <> 0 OR r.revoked <> 3 THEN
        RAISE EXCEPTION 'revoke 5 of 3 gives back 3, never below zero: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.revoke('calls', 'nobody');
    IF NOT r.found OR r.revoked <> 0 THEN
        RAISE EXCEPTION 'revoke without a counter: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.revoke_keyed('refunds', 'r-1', 'calls', 'bob', 1);
    IF r.grant_id < 1 OR r.revoked <> 1 OR r.used <> 0 THEN
        RAISE EXCEPTION 'keyed revoke: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.revoke_keyed('refunds', 'r-1', 'calls', 'bob', 1);
    IF r.prior_grant_id < 1 OR r.grant_id <> 0 THEN
        RAISE EXCEPTION 'keyed revoke replay: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.compensate_grant(v_id);
    IF NOT r.revoked_now OR r.compensated <> 2 OR r.compensated_used <> 0 OR r.written_used <> 0 OR r.target <> 'calls' THEN
        RAISE EXCEPTION 'compensation: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.compensate_grant(v_id);
    IF r.revoked_now OR r.written_used <> -1 THEN
        RAISE EXCEPTION 'a second compensation gives nothing back: %', r;
    END IF;
    IF (SELECT used FROM pgquota.usage WHERE quota_name = 'calls' AND member = 'erin') <> 0 THEN
        RAISE EXCEPTION 'erin''s units are back';
    END IF;
    IF EXISTS (SELECT 1 FROM pgquota.compensate_grant(123456)) THEN
        RAISE EXCEPTION 'no row for an unknown grant id';
    END IF;
END
$$;

-- A rate quota through pgquota.grant (2 per minute, burst 2); keyed grants
-- and revokes refuse it and write nothing.
DO $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pgquota.grant('per-min', 'fay', 2);
    IF NOT (r.found AND r.kind = 'rate' AND r.granted AND r.remaining = 0 AND r.burst = 2
            AND r.period_ms = 60000 AND r.retry_after_ms = 0 AND r.window_start IS NULL) THEN
        RAISE EXCEPTION 'rate grant: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.grant('per-min', 'fay', 1);
    IF r.granted OR r.retry_after_ms NOT BETWEEN 1 AND 30000 THEN
        RAISE EXCEPTION 'rate denial waits one emission interval (30 s) at most: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.grant_keyed('s', 'k', 'per-min', 'fay', 1);
    IF r.kind <> 'rate' OR r.grant_id <> 0 OR r.prior_grant_id <> 0 THEN
        RAISE EXCEPTION 'keyed grant on a rate: %', r;
    END IF;
    SELECT * INTO r FROM pgquota.revoke('per-min', 'fay', 1);
    IF r.kind <> 'rate' OR r.decided_at IS NOT NULL THEN
        RAISE EXCEPTION 'revoke on a rate: %', r;
    END IF;
    IF EXISTS (SELECT 1 FROM pgquota.ledger WHERE scope = 's') THEN
        RAISE EXCEPTION 'nothing is recorded for a keyed call on a rate';
    END IF;
END
$$;

-- Bad input: SQLSTATE 22023, a message naming the parameter, nothing written.
DO $$
DECLARE
    c       text[];
    v_state text;
    v_msg   text;
    v_seen  boolean;
    v_rows  bigint := (SELECT count(*) FROM pgquota.usage) + (SELECT count(*) FROM pgquota.ledger);
BEGIN
    FOREACH c SLICE 1 IN ARRAY ARRAY[
        ['SELECT * FROM pgquota.grant(''calls'', '''', 1)', 'p_member'],
        ['SELECT * FROM pgquota.grant(''calls'', NULL, 1)', 'p_member'],
        ['SELECT * FROM pgquota.grant(''calls'', repeat(''x'', 256), 1)', 'p_member'],
        ['SELECT * FROM pgquota.grant('''', ''zed'', 1)', 'p_quota'],
        ['SELECT * FROM pgquota.grant(''calls'', ''zed'', 0)', 'p_amount'],
        ['SELECT * FROM pgquota.grant(''calls'', ''zed'', NULL)', 'p_amount'],
        ['SELECT * FROM pgquota.grant(''calls'', ''zed'', 1, -1)', 'p_limit'],
        ['SELECT * FROM pgquota.grant(''per-min'', ''zed'', -5)', 'p_amount'],
        ['SELECT * FROM pgquota.grant_keyed('''', ''k'', ''calls'', ''zed'', 1)', 'p_scope'],
        ['SELECT * FROM pgquota.grant_keyed(''s'', NULL, ''calls'', ''zed'', 1)', 'p_key'],
        ['SELECT * FROM pgquota.grant_keyed(''s'', ''k'', ''calls'', ''zed'', 1, -2)', 'p_limit'],
        ['SELECT * FROM pgquota.revoke(''calls'', '''', 1)', 'p_member'],
        ['SELECT * FROM pgquota.revoke(''calls'', ''alice'', 0)', 'p_amount'],
        ['SELECT * FROM pgquota.revoke_keyed(''s'', '''', ''calls'', ''alice'', 1)', 'p_key'],
        ['SELECT * FROM pgquota.compensate_grant(0)', 'p_grant_id'],
        ['SELECT * FROM pgquota.compensate_grant(NULL)', 'p_grant_id'],
        ['SELECT * FROM pgquota.grant(''calls'', E''a\tb'', 1)', 'p_member'],
        ['SELECT * FROM pgquota.grant_keyed(''s'', E''k\n'', ''calls'', ''zed'', 1)', 'p_key'],
        ['SELECT * FROM pgquota.grant_limits(ARRAY[''per-min''], ''zed'', -100, NULL)', 'p_amount'],
        ['SELECT * FROM pgquota.grant_limits(ARRAY[''per-min''], ''zed'', 0, NULL)', 'p_amount'],
        ['SELECT * FROM pgquota.grant_limits(ARRAY[''per-min''], ''zed'', 1, -1)', 'p_limit'],
        ['SELECT * FROM pgquota.grant_limits(ARRAY[''per-min''], E''z\ted'', 1, NULL)', 'p_member'],
        ['SELECT * FROM pgquota.grant_limits(ARRAY[]::text[], ''zed'', 1, NULL)', 'p_quotas'],
        ['SELECT * FROM pgquota.limit_usage(''calls'', NULL)', 'p_member'],
        ['SELECT * FROM pgquota.limit_usage(''calls'', repeat(''x'', 300))', 'p_member'],
        ['SELECT * FROM pgquota.limit_usage('''', ''zed'')', 'p_quota']
    ] LOOP
        v_seen := false;
        BEGIN
            EXECUTE c[1];
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
            v_seen := true;
        END;
        IF NOT v_seen THEN
            RAISE EXCEPTION 'no error from %', c[1];
        END IF;
        IF v_state <> '22023' OR position(c[2] IN v_msg) = 0 THEN
            RAISE EXCEPTION '% raised % "%", want 22023 naming %', c[1], v_state, v_msg, c[2];
        END IF;
    END LOOP;
    IF (SELECT count(*) FROM pgquota.usage) + (SELECT count(*) FROM pgquota.ledger) <> v_rows THEN
        RAISE EXCEPTION 'bad input wrote rows';
    END IF;
END
$$;

-- An unknown quota is an error, SQLSTATE PQ010 naming the function and the
-- quota (where grant and grant_keyed returned found = f, granted = f, which
-- reads as a denial, and limit_usage no row); nothing is written. A keyed
-- call whose key was taken before still replays. limit_usage reports burst
-- and period_ms 0 where a kind has none, as grant does (not NULL).
DO $$
DECLARE
    c       text[];
    v_state text;
    v_msg   text;
    v_seen  boolean;
    v_rows  bigint := (SELECT count(*) FROM pgquota.usage) + (SELECT count(*) FROM pgquota.ledger);
    r       record;
    g       record;
BEGIN
    FOREACH c SLICE 1 IN ARRAY ARRAY[
        ['SELECT * FROM pgquota.grant(''nope'', ''alice'', 1)', 'pgquota.grant: quota ''nope'' does not exist'],
        ['SELECT * FROM pgquota.grant_keyed(''s'', ''never-used'', ''nope'', ''alice'', 1)', 'pgquota.grant_keyed: quota ''nope'''],
        ['SELECT * FROM pgquota.limit_usage(''nope'', ''alice'')', 'pgquota.limit_usage: quota ''nope''']
    ] LOOP
        v_seen := false;
        BEGIN
            EXECUTE c[1];
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
            v_seen := true;
        END;
        IF NOT v_seen OR v_state <> 'PQ010' OR position(c[2] IN v_msg) = 0 THEN
            RAISE EXCEPTION '% raised % "%" (seen %), want PQ010 with %', c[1], v_state, v_msg, v_seen, c[2];
        END IF;
    END LOOP;
    IF (SELECT count(*) FROM pgquota.usage) + (SELECT count(*) FROM pgquota.ledger) <> v_rows THEN
        RAISE EXCEPTION 'an unknown quota wrote rows';
    END IF;

    -- A key taken before replays although its quota is gone.
    INSERT INTO pgquota.quota (name, window_unit, default_limit) VALUES ('gone', 'day', 5);
    SELECT * INTO g FROM pgquota.grant_keyed('s', 'gone-1', 'gone', 'alice', 1);
    DELETE FROM pgquota.quota WHERE name = 'gone';
    SELECT * INTO r FROM pgquota.grant_keyed('s', 'gone-1', 'gone', 'alice', 1);
    IF r.prior_grant_id <> g.grant_id OR r.found THEN
        RAISE EXCEPTION 'a taken key of a deleted quota replays: %', r;
    END IF;

    SELECT * INTO r FROM pgquota.limit_usage('calls', 'alice');
    SELECT * INTO g FROM pgquota.grant('calls', 'alice', 100);
    IF r.burst IS DISTINCT FROM 0 OR r.period_ms IS DISTINCT FROM 0 OR r.burst <> g.burst OR r.period_ms <> g.period_ms THEN
        RAISE EXCEPTION 'limit_usage burst/period_ms %/% where grant returns %/%', r.burst, r.period_ms, g.burst, g.period_ms;
    END IF;
    SELECT * INTO r FROM pgquota.limit_usage('per-min', 'alice');
    IF r.burst <> 2 OR r.period_ms <> 60000 THEN
        RAISE EXCEPTION 'a rate''s burst and period: %', r;
    END IF;
END
$$;
