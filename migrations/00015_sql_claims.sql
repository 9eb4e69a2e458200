-- Voucher claims as SQL functions: ONE definition of each campaign kind's
-- claim, served to the keyless and the keyed call alike, one round trip per
-- call (docs/sql.md, "Voucher claims", is their public description).
--
--   pgquota.claim(p_campaign, p_member)                      keyless
--   pgquota.claim_keyed(p_scope, p_key, p_campaign, p_member) with an
--                                                            idempotency key
--
-- Both read the campaign's kind and call its function: claim_counted,
-- claim_sharded or claim_codes (through claim_run, which also stores a keyed
-- call's outcome). They replace the statements VoucherClaimCounted,
-- VoucherShardClaim, VoucherCodeClaim, LedgerClaimVoucher, LedgerClaimShard
-- and LedgerClaimCode, keeping their guarantees, which rest on the same
-- facts (the PostgreSQL manual, section 13.2.1):
--   * a locking read (FOR UPDATE) under READ COMMITTED waits for a
--     concurrent writer to end and re-checks its WHERE clause on the newest
--     row version, so the pool or shard row it returns has room, and stays
--     locked until the transaction ends;
--   * FOR UPDATE SKIP LOCKED moves on from rows other claims hold;
--   * the primary key (campaign, member) of pgquota.voucher_claim is the
--     guard against a member's second voucher: the claim is inserted with
--     ON CONFLICT DO NOTHING, and only an inserted claim moves a counter or
--     marks a code. The CHECK claimed <= total stays as a backstop;
--   * a keyed call inserts its ledger key (pgquota.ledger, ON CONFLICT DO
--     NOTHING) before it locks any pool or shard row (codes: after a SKIP
--     LOCKED pick, which never waits), so keyed calls take their locks in
--     one order, key then pool row, and of any number of copies of one key
--     exactly one writes; the others write nothing and report the key's
--     grant id (prior_grant_id).
-- Each statement of a PL/pgSQL function (VOLATILE) takes a new snapshot
-- under READ COMMITTED, so what the one-statement versions read through the
-- "fresh" helpers (pgquota.voucher_claim_fresh and the like) is read by the
-- next statement here: a claim that committed while this call waited is
-- seen. Under REPEATABLE READ or SERIALIZABLE every statement reads the
-- transaction's snapshot and a conflicting concurrent change fails the call
-- with SQLSTATE 40001, as before (pgquota retries when it owns the
-- transaction).

-- +goose Up

-- What a kind's claim function did, for claim_run.
CREATE TYPE pgquota.claim_step AS (
    -- grant_id: the ledger row this keyed call inserted; NULL without a key,
    -- and when prior_grant_id is set.
    grant_id       bigint,
    -- prior_grant_id: the key's grant id when an earlier call holds the key;
    -- this call wrote nothing.
    prior_grant_id bigint,
    -- claimed_now: this call handed the unit or code out.
    claimed_now    boolean,
    -- seq (counted, sharded) or code (codes), and claimed_at: the member's
    -- voucher after the call, NULL when the member holds none.
    seq            bigint,
    code           text,
    claimed_at     timestamptz,
    -- used: a counted pool's claimed counter after this call's claim (0
    -- otherwise; stored as the keyed outcome's used).
    used           bigint,
    -- busy: a code campaign whose unclaimed codes are all locked by claims
    -- in progress; nothing was written, and the call may be repeated.
    busy           boolean,
    -- shards: a sharded pool's number of shards (0 for other kinds).
    shards         integer
);

-- pgquota.claim_check_name raises SQLSTATE 22023 (invalid_parameter_value)
-- naming p_param unless p_value is a valid name: 1 to 255 bytes, no control
-- characters (quota/validate.go checkName, which Go callers pass first).
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_check_name(p_param text, p_value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION 'pgquota: % must not be NULL', p_param USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_value = '' THEN
        RAISE EXCEPTION 'pgquota: % must not be empty', p_param USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(p_value) > 255 THEN
        RAISE EXCEPTION 'pgquota: % is % bytes long, the limit is 255', p_param, octet_length(p_value)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_value ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'pgquota: % must not contain control characters', p_param
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
-- +goose StatementEnd

-- pgquota.claim_key takes an idempotency key for a claim: inserted_id is
-- the new ledger row's grant id, or prior_id the grant id of the call that
-- holds the key (inserted_id NULL then). The insert waits for a concurrent
-- copy of the key that has not committed; when that copy commits, the key's
-- row is read with a fresh snapshot (pgquota.ledger_key_fresh); when the
-- row is gone meanwhile (reaped), the key is free and the insert runs again.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_key(p_scope text, p_key text, p_campaign text, p_member text, p_at timestamptz,
                                  OUT inserted_id bigint, OUT prior_id bigint)
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    LOOP
        INSERT INTO pgquota.ledger AS l (scope, idempotency_key, operation, target, member, amount, created_at)
        VALUES (p_scope, p_key, 'claim', p_campaign, p_member, 1, p_at)
        ON CONFLICT (scope, idempotency_key) DO NOTHING
        RETURNING l.grant_id INTO inserted_id;
        IF inserted_id IS NOT NULL THEN
            RETURN;
        END IF;
        prior_id := nullif(pgquota.ledger_key_fresh(p_scope, p_key), 0);
        IF prior_id IS NOT NULL THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- pgquota.claim_counted claims one unit of a counted pool (was
-- VoucherClaimCounted, and LedgerClaimVoucher with p_key). The pool row is
-- locked with a locking read guarded by claimed < total, after the ledger
-- key; a sold-out pool is not locked at all. The read of the member's claim
-- (the statement's snapshot) only spares a member who holds a unit from
-- queueing on the pool lock; the primary key is the guard. When no unit
-- was handed out, the member's claim is read again by a later statement (a
-- fresh snapshot), so a double-click that lost the race sees the first
-- click's claim.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_counted(p_campaign text, p_member text, p_scope text, p_key text, p_at timestamptz)
    RETURNS pgquota.claim_step
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    r      pgquota.claim_step;
    v_held pgquota.voucher_claim;
BEGIN
    r.claimed_now := false; r.used := 0; r.busy := false; r.shards := 0;
    IF p_key IS NOT NULL THEN
        SELECT k.inserted_id, k.prior_id INTO r.grant_id, r.prior_grant_id
        FROM pgquota.claim_key(p_scope, p_key, p_campaign, p_member, p_at) k;
        IF r.prior_grant_id IS NOT NULL THEN
            RETURN r;
        END IF;
    END IF;
    -- Lock, claim row and counter in one statement: every claim of the
    -- pool queues on its row, so what a claim does between locking it and
    -- its transaction's end is kept to one statement (not three).
    WITH pool AS (
        SELECT p.campaign, p.claimed
        FROM pgquota.voucher_pool p
        WHERE p.campaign = p_campaign AND p.kind = 'counted' AND p.claimed < p.total
          AND NOT EXISTS (SELECT 1 FROM pgquota.voucher_claim c
                          WHERE c.campaign = p_campaign AND c.member = p_member)
        FOR UPDATE OF p
    ), ins AS (
        INSERT INTO pgquota.voucher_claim AS c (campaign, member, seq, claimed_at)
        SELECT pool.campaign, p_member, pool.claimed + 1, pgquota.clock()
        FROM pool
        ON CONFLICT (campaign, member) DO NOTHING
        RETURNING c.seq, c.claimed_at
    ), upd AS (
        UPDATE pgquota.voucher_pool p
        SET claimed = p.claimed + 1
        FROM ins
        WHERE p.campaign = p_campaign
        RETURNING p.claimed
    )
    SELECT ins.seq, ins.claimed_at, upd.claimed INTO r.seq, r.claimed_at, r.used
    FROM ins, upd;
    IF r.seq IS NOT NULL THEN
        r.claimed_now := true;
        RETURN r;
    END IF;
    r.used := 0;
    v_held := pgquota.voucher_claim_fresh(p_campaign, p_member);
    r.seq := v_held.seq;
    r.claimed_at := v_held.claimed_at;
    RETURN r;
END
$$;
-- +goose StatementEnd

-- pgquota.claim_sharded claims one unit of a sharded pool (was
-- VoucherShardClaim, and LedgerClaimShard with p_key). It locks one shard
-- with room (claimed < total), trying the shards from a random one on, then
-- those before it, so that concurrent claimers lock different rows:
--   1. and 2. with FOR UPDATE SKIP LOCKED: a shard that is full or locked
--      by another claim is passed over without waiting;
--   3. and 4. only when every shard with room is locked, without SKIP
--      LOCKED: the claim waits for the first shard that has room in its
--      snapshot; when its holder commits, the locking read re-checks
--      claimed < total on the newest version and moves on if the shard is
--      full now; when the holder rolls back, the shard is taken.
-- Each step walks the primary key from its first shard and stops at the
-- first row it locks. A shard without room never gets one back (units are
-- never returned to a sharded pool), so when step 4 locks nothing every
-- shard is full: the pool is sold out, exactly, for keyed calls too (whose
-- outcome is stored). The unit number base + claimed + 1 comes from the
-- locked (newest) version. A final fresh read that still sees room raises
-- XX000: impossible while the reasoning above holds.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_sharded(p_campaign text, p_member text, p_scope text, p_key text, p_at timestamptz)
    RETURNS pgquota.claim_step
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    r       pgquota.claim_step;
    v_start integer;
    v_shard integer;
    v_seq   bigint;
    v_held  pgquota.voucher_claim;
    v_try   integer;
BEGIN
    r.claimed_now := false; r.used := 0; r.busy := false;
    -- Shards are numbered 0 .. shards - 1 (quota/shard.go shardSplit).
    r.shards := coalesce((SELECT s.shard + 1 FROM pgquota.voucher_shard s
                          WHERE s.campaign = p_campaign ORDER BY s.shard DESC LIMIT 1), 0);
    IF p_key IS NOT NULL THEN
        SELECT k.inserted_id, k.prior_id INTO r.grant_id, r.prior_grant_id
        FROM pgquota.claim_key(p_scope, p_key, p_campaign, p_member, p_at) k;
        IF r.prior_grant_id IS NOT NULL THEN
            RETURN r;
        END IF;
    END IF;
    -- The pick runs in a subtransaction, retried on a deadlock: a FOR UPDATE
    -- that finds a shard full on its newest version (it filled up after
    -- this statement's snapshot) skips it but keeps its lock until the
    -- transaction ends, so two claims that then wait for each other's next
    -- shard can deadlock (40P01). Rolling the subtransaction back releases
    -- every lock its pick took; the retry starts afresh, and nothing was
    -- written by the attempt that lost. The ledger key (above) stays.
    FOR v_try IN 1 .. 5 LOOP
        BEGIN
            v_shard := NULL; v_seq := NULL;
            IF NOT EXISTS (SELECT 1 FROM pgquota.voucher_claim c
                           WHERE c.campaign = p_campaign AND c.member = p_member) THEN
                v_start := floor(random() * r.shards)::integer;
                SELECT s.shard, s.base + s.claimed + 1 INTO v_shard, v_seq
                FROM pgquota.voucher_shard s
                WHERE s.campaign = p_campaign AND s.shard >= v_start AND s.claimed < s.total
                ORDER BY s.shard LIMIT 1
                FOR UPDATE OF s SKIP LOCKED;
                IF v_shard IS NULL THEN
                    SELECT s.shard, s.base + s.claimed + 1 INTO v_shard, v_seq
                    FROM pgquota.voucher_shard s
                    WHERE s.campaign = p_campaign AND s.shard < v_start AND s.claimed < s.total
                    ORDER BY s.shard LIMIT 1
                    FOR UPDATE OF s SKIP LOCKED;
                END IF;
                IF v_shard IS NULL THEN
                    SELECT s.shard, s.base + s.claimed + 1 INTO v_shard, v_seq
                    FROM pgquota.voucher_shard s
                    WHERE s.campaign = p_campaign AND s.shard >= v_start AND s.claimed < s.total
                    ORDER BY s.shard LIMIT 1
                    FOR UPDATE OF s;
                END IF;
                IF v_shard IS NULL THEN
                    SELECT s.shard, s.base + s.claimed + 1 INTO v_shard, v_seq
                    FROM pgquota.voucher_shard s
                    WHERE s.campaign = p_campaign AND s.shard < v_start AND s.claimed < s.total
                    ORDER BY s.shard LIMIT 1
                    FOR UPDATE OF s;
                END IF;
                IF v_shard IS NOT NULL THEN
                    -- The claim row, and the shard's counter only when it was
                    -- inserted, in one statement.
                    WITH ins AS (
                        INSERT INTO pgquota.voucher_claim AS c (campaign, member, seq, claimed_at)
                        VALUES (p_campaign, p_member, v_seq, pgquota.clock())
                        ON CONFLICT (campaign, member) DO NOTHING
                        RETURNING c.seq, c.claimed_at
                    ), upd AS (
                        UPDATE pgquota.voucher_shard s
                        SET claimed = s.claimed + 1
                        FROM ins
                        WHERE s.campaign = p_campaign AND s.shard = v_shard
                        RETURNING s.shard
                    )
                    SELECT ins.seq, ins.claimed_at INTO r.seq, r.claimed_at
                    FROM ins, upd;
                    IF r.seq IS NOT NULL THEN
                        r.claimed_now := true;
                        RETURN r;
                    END IF;
                END IF;
            END IF;
            EXIT;
        EXCEPTION WHEN deadlock_detected THEN
            IF v_try = 5 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    v_held := pgquota.voucher_claim_fresh(p_campaign, p_member);
    r.seq := v_held.seq;
    r.claimed_at := v_held.claimed_at;
    IF v_held.member IS NULL AND v_shard IS NULL AND pgquota.voucher_shards_left_fresh(p_campaign) THEN
        RAISE EXCEPTION 'pgquota: claim: campaign % still has units after every shard was found full', p_campaign
            USING ERRCODE = 'internal_error';
    END IF;
    RETURN r;
END
$$;
-- +goose StatementEnd

-- pgquota.claim_codes hands one unclaimed code to the member (was
-- VoucherCodeClaim, and LedgerClaimCode with p_key). The pick takes one
-- unclaimed code with FOR UPDATE SKIP LOCKED, so concurrent claimers take
-- different codes instead of queueing; it never waits, so a keyed call
-- inserts its ledger key after it and still takes no part in a lock cycle.
-- When the pick found nothing, the member's code and whether any unclaimed
-- code is left are read with ONE fresh snapshot
-- (pgquota.voucher_code_state_fresh explains why one): codes that SKIP
-- LOCKED passed over are held by claims that may still roll back, so the
-- campaign is sold out only when no unclaimed code is left at all.
-- Otherwise the call is busy: nothing is written (no ledger row either: the
-- outcome is not final), and the caller repeats it.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_codes(p_campaign text, p_member text, p_scope text, p_key text, p_at timestamptz)
    RETURNS pgquota.claim_step
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    r        pgquota.claim_step;
    v_code   text;
    v_state  record;
    v_held   pgquota.voucher_claim;
BEGIN
    r.claimed_now := false; r.used := 0; r.busy := false; r.shards := 0;
    IF NOT EXISTS (SELECT 1 FROM pgquota.voucher_claim c
                   WHERE c.campaign = p_campaign AND c.member = p_member) THEN
        SELECT v.code INTO v_code
        FROM pgquota.voucher_code v
        WHERE v.campaign = p_campaign AND v.member IS NULL
        LIMIT 1
        FOR UPDATE OF v SKIP LOCKED;
    END IF;
    IF v_code IS NULL THEN
        SELECT f.held_code, f.held_since, f.codes_left INTO v_state
        FROM pgquota.voucher_code_state_fresh(p_campaign, p_member) f;
        IF v_state.held_code IS NULL AND v_state.codes_left THEN
            r.busy := true;
            RETURN r;
        END IF;
    END IF;
    IF p_key IS NOT NULL THEN
        SELECT k.inserted_id, k.prior_id INTO r.grant_id, r.prior_grant_id
        FROM pgquota.claim_key(p_scope, p_key, p_campaign, p_member, p_at) k;
        IF r.prior_grant_id IS NOT NULL THEN
            RETURN r;
        END IF;
    END IF;
    IF v_code IS NULL THEN
        r.code := v_state.held_code;
        r.claimed_at := v_state.held_since;
        RETURN r;
    END IF;
    -- The claim row, and the code's mark only when it was inserted, in one
    -- statement.
    WITH ins AS (
        INSERT INTO pgquota.voucher_claim AS c (campaign, member, code, claimed_at)
        VALUES (p_campaign, p_member, v_code, pgquota.clock())
        ON CONFLICT (campaign, member) DO NOTHING
        RETURNING c.code, c.claimed_at
    ), upd AS (
        UPDATE pgquota.voucher_code v
        SET member = p_member, claimed_at = ins.claimed_at
        FROM ins
        WHERE v.campaign = p_campaign AND v.code = ins.code
        RETURNING v.code
    )
    SELECT ins.code, ins.claimed_at INTO r.code, r.claimed_at
    FROM ins, upd;
    IF r.code IS NOT NULL THEN
        r.claimed_now := true;
        RETURN r;
    END IF;
    -- A duplicate claim of the member committed first: its code is the
    -- member's; the picked code stays unclaimed.
    v_held := pgquota.voucher_claim_fresh(p_campaign, p_member);
    r.code := v_held.code;
    r.claimed_at := v_held.claimed_at;
    RETURN r;
END
$$;
-- +goose StatementEnd

-- pgquota.claim_run is the body of claim and claim_keyed (p_key NULL: no
-- key): it validates the campaign and member, reads the campaign's kind,
-- makes the commit durable (pgquota.durable_commit, 00007: a claim that
-- reported success survives a crash under synchronous_commit = off), calls
-- the kind's function and, for a keyed call that inserted its key, stores
-- the outcome in pgquota.ledger_outcome, every outcome included (sold out,
-- a member who already held a voucher). It returns one row; claim and
-- claim_keyed document the columns.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_run(p_scope text, p_key text, p_campaign text, p_member text)
RETURNS TABLE (
    found boolean, kind text, total bigint, claimed boolean, repeat boolean, seq bigint, code text,
    claimed_at timestamptz, sold_out boolean, busy boolean, shards integer, grant_id bigint, prior_grant_id bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_kind    text;
    v_total   bigint;
    v_at      timestamptz;
    v_claimed boolean;
    r         pgquota.claim_step;
BEGIN
    PERFORM pgquota.claim_check_name('p_campaign', p_campaign);
    PERFORM pgquota.claim_check_name('p_member', p_member);
    SELECT p.kind, p.total INTO v_kind, v_total
    FROM pgquota.voucher_pool p
    WHERE p.campaign = p_campaign;
    IF v_kind IS NULL THEN
        -- No such campaign. A key used before is still replayed.
        RETURN QUERY SELECT false, ''::text, 0::bigint, false, false, 0::bigint, ''::text,
                            NULL::timestamptz, false, false, 0, 0::bigint,
                            CASE WHEN p_key IS NULL THEN 0::bigint ELSE pgquota.ledger_key_fresh(p_scope, p_key) END;
        RETURN;
    END IF;
    PERFORM pgquota.durable_commit();
    v_at := pgquota.clock();
    r := CASE v_kind
             WHEN 'counted' THEN pgquota.claim_counted(p_campaign, p_member, p_scope, p_key, v_at)
             WHEN 'sharded' THEN pgquota.claim_sharded(p_campaign, p_member, p_scope, p_key, v_at)
             WHEN 'codes' THEN pgquota.claim_codes(p_campaign, p_member, p_scope, p_key, v_at)
         END;
    IF r.prior_grant_id IS NOT NULL THEN
        RETURN QUERY SELECT true, v_kind, v_total, false, false, 0::bigint, ''::text,
                            NULL::timestamptz, false, false, r.shards, 0::bigint, r.prior_grant_id;
        RETURN;
    END IF;
    v_claimed := r.claimed_at IS NOT NULL;
    IF r.grant_id IS NOT NULL THEN
        INSERT INTO pgquota.ledger_outcome (grant_id, granted, used, limit_value, seq, code, repeat, claimed_at, decided_at)
        VALUES (r.grant_id, v_claimed, r.used, v_total, coalesce(r.seq, 0), coalesce(r.code, ''),
                v_claimed AND NOT r.claimed_now, r.claimed_at, v_at);
    END IF;
    RETURN QUERY SELECT true, v_kind, v_total, v_claimed, v_claimed AND NOT r.claimed_now,
                        coalesce(r.seq, 0), coalesce(r.code, ''), r.claimed_at,
                        NOT v_claimed AND NOT r.busy, r.busy, r.shards, coalesce(r.grant_id, 0), 0::bigint;
END
$$;
-- +goose StatementEnd

-- pgquota.claim claims one voucher of p_campaign for p_member, whatever
-- the campaign's kind (counted, sharded, codes), and returns one row:
--   found       the campaign exists (false: every other column is empty);
--   kind        'counted', 'sharded' or 'codes';
--   total       the campaign's total (units, or codes imported);
--   claimed     the member holds a voucher after the call;
--   repeat      that voucher came from an earlier call (nothing was taken);
--   seq         the unit's number (counted, sharded; 0 for codes);
--   code        the code (codes; '' otherwise);
--   claimed_at  when the voucher was claimed (NULL without one);
--   sold_out    no voucher is left for the member;
--   busy        codes only: unclaimed codes are left, but every one is
--               locked by a claim in progress (it may roll back); nothing
--               was written, call again;
--   shards      a sharded pool's number of shards (0 otherwise).
-- Raises 22023 for a NULL, empty, longer than 255 bytes or control
-- character holding p_campaign or p_member (the message names it), before
-- anything is written.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim(p_campaign text, p_member text)
RETURNS TABLE (
    found boolean, kind text, total bigint, claimed boolean, repeat boolean, seq bigint, code text,
    claimed_at timestamptz, sold_out boolean, busy boolean, shards integer
)
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN QUERY SELECT r.found, r.kind, r.total, r.claimed, r.repeat, r.seq, r.code, r.claimed_at,
                        r.sold_out, r.busy, r.shards
                 FROM pgquota.claim_run(NULL, NULL, p_campaign, p_member) r;
END
$$;
-- +goose StatementEnd

-- pgquota.claim_keyed is pgquota.claim recorded in the ledger under the
-- idempotency key (p_scope, p_key), claim and ledger row in one call. Its
-- row adds:
--   grant_id        the ledger entry this call made (0 when it made none);
--   prior_grant_id  the key's ledger entry when an earlier call made it:
--                   this call wrote nothing, and every other column but
--                   found, kind, total and shards is empty. The caller reads
--                   that entry (pgquota.ledger_entry) and replays its
--                   outcome when it was made for the same campaign and
--                   member, or reports the key reused.
-- Every final outcome is stored and replayed (sold out included); a busy
-- code claim stores nothing. Raises 22023 as pgquota.claim does, for
-- p_scope and p_key too.
-- +goose StatementBegin
CREATE FUNCTION pgquota.claim_keyed(p_scope text, p_key text, p_campaign text, p_member text)
RETURNS TABLE (
    found boolean, kind text, total bigint, claimed boolean, repeat boolean, seq bigint, code text,
    claimed_at timestamptz, sold_out boolean, busy boolean, shards integer, grant_id bigint, prior_grant_id bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM pgquota.claim_check_name('p_scope', p_scope);
    PERFORM pgquota.claim_check_name('p_key', p_key);
    RETURN QUERY SELECT * FROM pgquota.claim_run(p_scope, p_key, p_campaign, p_member);
END
$$;
-- +goose StatementEnd

-- The application role gets the functions (default privileges cover them
-- when this runs as the owner that ran 00010; this covers a migration run
-- as another owner).
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
DROP FUNCTION pgquota.claim_keyed(text, text, text, text);
DROP FUNCTION pgquota.claim(text, text);
DROP FUNCTION pgquota.claim_run(text, text, text, text);
DROP FUNCTION pgquota.claim_codes(text, text, text, text, timestamptz);
DROP FUNCTION pgquota.claim_sharded(text, text, text, text, timestamptz);
DROP FUNCTION pgquota.claim_counted(text, text, text, text, timestamptz);
DROP FUNCTION pgquota.claim_key(text, text, text, text, timestamptz);
DROP FUNCTION pgquota.claim_check_name(text, text);
DROP TYPE pgquota.claim_step;
