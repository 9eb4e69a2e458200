-- Voucher claims through the public SQL interface (docs/sql.md, "Voucher
-- claims"): pgquota.claim and pgquota.claim_keyed on every campaign kind.
-- Run on a freshly migrated database:
--   psql -X -q -v ON_ERROR_STOP=1 -d URL -f claim.sql
-- Every check that fails raises an exception (psql then exits non-zero).
-- The campaigns are created as CreateCampaign, CreateShardedCampaign and
-- ImportCodes create them (rows of pgquota.voucher_pool, voucher_shard and
-- voucher_code), under names of their own (sqltest_claim_*).

\set QUIET on
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.expect(ok boolean, what text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'claim.sql: %', what;
    END IF;
END
$$;

-- A counted pool of 2 units, a sharded pool of 5 units in 3 shards
-- (2, 2, 1: units 1-2, 3-4, 5), and a code campaign of 2 codes.
INSERT INTO pgquota.voucher_pool (campaign, kind, total) VALUES
    ('sqltest_claim_counted', 'counted', 2),
    ('sqltest_claim_sharded', 'sharded', 5),
    ('sqltest_claim_codes', 'codes', 2);
INSERT INTO pgquota.voucher_shard (campaign, shard, base, total) VALUES
    ('sqltest_claim_sharded', 0, 0, 2),
    ('sqltest_claim_sharded', 1, 2, 2),
    ('sqltest_claim_sharded', 2, 4, 1);
INSERT INTO pgquota.voucher_code (campaign, code) VALUES
    ('sqltest_claim_codes', 'CODE-A'),
    ('sqltest_claim_codes', 'CODE-B');

-- Counted: units 1 and 2, a repeat returns the first claim, then sold out.
DO $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_counted', 'alice');
    PERFORM pg_temp.expect(r.found AND r.kind = 'counted' AND r.total = 2, 'counted: found, kind, total');
    PERFORM pg_temp.expect(r.claimed AND NOT r.repeat AND r.seq = 1 AND r.code = '' AND r.claimed_at IS NOT NULL,
                           format('counted: alice gets unit 1, got %s', r));
    PERFORM pg_temp.expect(NOT r.sold_out AND NOT r.busy AND r.shards = 0, 'counted: not sold out, not busy, no shards');

    SELECT * INTO r FROM pgquota.claim('sqltest_claim_counted', 'alice');
    PERFORM pg_temp.expect(r.claimed AND r.repeat AND r.seq = 1, format('counted: alice again is a repeat of unit 1, got %s', r));

    SELECT * INTO r FROM pgquota.claim('sqltest_claim_counted', 'bob');
    PERFORM pg_temp.expect(r.claimed AND NOT r.repeat AND r.seq = 2, format('counted: bob gets unit 2, got %s', r));

    SELECT * INTO r FROM pgquota.claim('sqltest_claim_counted', 'carol');
    PERFORM pg_temp.expect(r.found AND NOT r.claimed AND r.sold_out AND r.seq = 0 AND r.claimed_at IS NULL,
                           format('counted: carol finds it sold out, got %s', r));

    PERFORM pg_temp.expect((SELECT claimed FROM pgquota.voucher_pool WHERE campaign = 'sqltest_claim_counted') = 2,
                           'counted: the pool counts 2 claimed');
    PERFORM pg_temp.expect((SELECT array_agg(member || ':' || seq ORDER BY seq) FROM pgquota.voucher_claim
                            WHERE campaign = 'sqltest_claim_counted') = '{alice:1,bob:2}',
                           'counted: claim rows alice:1, bob:2');
END
$$;

-- Sharded: 5 members get units 1..5 once each, the 6th finds it sold out.
DO $$
DECLARE
    r    record;
    seqs bigint[] := '{}';
BEGIN
    FOR i IN 1 .. 5 LOOP
        SELECT * INTO r FROM pgquota.claim('sqltest_claim_sharded', 'm' || i);
        PERFORM pg_temp.expect(r.found AND r.kind = 'sharded' AND r.total = 5 AND r.shards = 3,
                               format('sharded: kind, total, shards, got %s', r));
        PERFORM pg_temp.expect(r.claimed AND NOT r.repeat AND r.seq BETWEEN 1 AND 5, format('sharded: m%s claims, got %s', i, r));
        seqs := seqs || r.seq;
    END LOOP;
    PERFORM pg_temp.expect((SELECT array_agg(s ORDER BY s) FROM unnest(seqs) s) = '{1,2,3,4,5}',
                           format('sharded: units 1..5 once each, got %s', seqs));
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_sharded', 'm3');
    PERFORM pg_temp.expect(r.claimed AND r.repeat AND r.seq = seqs[3], format('sharded: m3 again is a repeat, got %s', r));
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_sharded', 'm6');
    PERFORM pg_temp.expect(NOT r.claimed AND r.sold_out AND NOT r.busy, format('sharded: m6 finds it sold out, got %s', r));
    PERFORM pg_temp.expect((SELECT array_agg(claimed ORDER BY shard) FROM pgquota.voucher_shard
                            WHERE campaign = 'sqltest_claim_sharded') = '{2,2,1}',
                           'sharded: every shard full, none over');
END
$$;

-- Codes: two members get the two codes, a repeat returns the member's
-- code, the third is sold out (no code is locked by anyone: not busy).
DO $$
DECLARE
    r  record;
    c1 text;
BEGIN
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_codes', 'alice');
    PERFORM pg_temp.expect(r.found AND r.kind = 'codes' AND r.total = 2 AND r.claimed AND NOT r.repeat
                           AND r.code IN ('CODE-A', 'CODE-B') AND r.seq = 0, format('codes: alice gets a code, got %s', r));
    c1 := r.code;
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_codes', 'alice');
    PERFORM pg_temp.expect(r.claimed AND r.repeat AND r.code = c1, format('codes: alice again gets %s, got %s', c1, r));
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_codes', 'bob');
    PERFORM pg_temp.expect(r.claimed AND NOT r.repeat AND r.code <> c1, format('codes: bob gets the other code, got %s', r));
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_codes', 'carol');
    PERFORM pg_temp.expect(NOT r.claimed AND r.sold_out AND NOT r.busy AND r.code = '', format('codes: carol sold out, got %s', r));
    PERFORM pg_temp.expect((SELECT count(*) FROM pgquota.voucher_code WHERE campaign = 'sqltest_claim_codes' AND member IS NULL) = 0,
                           'codes: both codes marked');
END
$$;

-- An unknown campaign: one row, found false, nothing written.
DO $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pgquota.claim('sqltest_claim_nope', 'alice');
    PERFORM pg_temp.expect(NOT r.found AND r.kind = '' AND NOT r.claimed AND NOT r.sold_out, format('unknown campaign, got %s', r));
    SELECT * INTO r FROM pgquota.claim_keyed('sqltest', 'nope-1', 'sqltest_claim_nope', 'alice');
    PERFORM pg_temp.expect(NOT r.found AND r.grant_id = 0 AND r.prior_grant_id = 0, format('unknown campaign, keyed, got %s', r));
    PERFORM pg_temp.expect(NOT EXISTS (SELECT 1 FROM pgquota.ledger WHERE idempotency_key = 'nope-1'), 'unknown campaign: no ledger row');
END
$$;

-- Keyed claims: a new counted pool of 1 unit, in every kind's function.
INSERT INTO pgquota.voucher_pool (campaign, kind, total) VALUES
    ('sqltest_claim_keyed', 'counted', 1),
    ('sqltest_claim_keyed_sharded', 'sharded', 1),
    ('sqltest_claim_keyed_codes', 'codes', 1);
INSERT INTO pgquota.voucher_shard (campaign, shard, base, total) VALUES ('sqltest_claim_keyed_sharded', 0, 0, 1);
INSERT INTO pgquota.voucher_code (campaign, code) VALUES ('sqltest_claim_keyed_codes', 'ONLY');

DO $$
DECLARE
    camp   text;
    r      record;
    first  record;
    claims bigint;
    rows   bigint;
BEGIN
    FOREACH camp IN ARRAY ARRAY['sqltest_claim_keyed', 'sqltest_claim_keyed_sharded', 'sqltest_claim_keyed_codes'] LOOP
        -- The first call with a key claims, and records the claim.
        SELECT * INTO first FROM pgquota.claim_keyed(camp, 'click-1', camp, 'alice');
        PERFORM pg_temp.expect(first.found AND first.claimed AND NOT first.repeat AND first.grant_id > 0 AND first.prior_grant_id = 0,
                               format('%s: keyed claim, got %s', camp, first));
        PERFORM pg_temp.expect(EXISTS (SELECT 1 FROM pgquota.ledger_entry e
                                       WHERE e.grant_id = first.grant_id AND e.operation = 'claim' AND e.target = camp
                                         AND e.member = 'alice' AND e.granted AND NOT e.repeat AND e.limit_value = 1
                                         AND e.seq = first.seq AND e.code = first.code AND e.claimed_at = first.claimed_at),
                               format('%s: the ledger entry holds the outcome', camp));
        SELECT count(*) INTO claims FROM pgquota.voucher_claim WHERE campaign = camp;
        SELECT count(*) INTO rows FROM pgquota.ledger;

        -- A replay: same key, same request. Nothing written; the earlier
        -- entry is named.
        SELECT * INTO r FROM pgquota.claim_keyed(camp, 'click-1', camp, 'alice');
        PERFORM pg_temp.expect(r.found AND r.prior_grant_id = first.grant_id AND r.grant_id = 0 AND NOT r.claimed,
                               format('%s: replay names grant %s, got %s', camp, first.grant_id, r));

        -- Key reuse: same key, another member. Nothing written; the entry
        -- named was made for alice, so the caller reports the key reused.
        SELECT * INTO r FROM pgquota.claim_keyed(camp, 'click-1', camp, 'bob');
        PERFORM pg_temp.expect(r.prior_grant_id = first.grant_id AND r.grant_id = 0,
                               format('%s: key reuse names grant %s, got %s', camp, first.grant_id, r));
        PERFORM pg_temp.expect((SELECT member FROM pgquota.ledger WHERE grant_id = r.prior_grant_id) = 'alice',
                               format('%s: the entry named is alice''s', camp));
        PERFORM pg_temp.expect((SELECT count(*) FROM pgquota.voucher_claim WHERE campaign = camp) = claims
                               AND (SELECT count(*) FROM pgquota.ledger) = rows,
                               format('%s: a replay and a reused key write nothing', camp));

        -- A new key for the member who holds the voucher: a stored repeat.
        SELECT * INTO r FROM pgquota.claim_keyed(camp, 'click-2', camp, 'alice');
        PERFORM pg_temp.expect(r.claimed AND r.repeat AND r.grant_id > first.grant_id AND r.seq = first.seq AND r.code = first.code,
                               format('%s: a second key is a stored repeat, got %s', camp, r));
        PERFORM pg_temp.expect((SELECT repeat AND granted FROM pgquota.ledger_entry WHERE grant_id = r.grant_id),
                               format('%s: the repeat is stored', camp));

        -- Sold out is an outcome, stored too, and replayed.
        SELECT * INTO r FROM pgquota.claim_keyed(camp, 'carol-1', camp, 'carol');
        PERFORM pg_temp.expect(NOT r.claimed AND r.sold_out AND r.grant_id > 0, format('%s: carol sold out, got %s', camp, r));
        PERFORM pg_temp.expect((SELECT NOT granted FROM pgquota.ledger_entry WHERE grant_id = r.grant_id),
                               format('%s: the sold-out outcome is stored', camp));
        PERFORM pg_temp.expect((SELECT prior_grant_id FROM pgquota.claim_keyed(camp, 'carol-1', camp, 'carol')) = r.grant_id,
                               format('%s: the sold-out outcome is replayed', camp));
        PERFORM pg_temp.expect((SELECT count(*) FROM pgquota.voucher_claim WHERE campaign = camp) = 1,
                               format('%s: exactly one claim row', camp));
    END LOOP;
END
$$;

-- Bad input: SQLSTATE 22023 naming the parameter, and nothing written.
DO $$
DECLARE
    c      record;
    claims bigint := (SELECT count(*) FROM pgquota.voucher_claim);
    rows   bigint := (SELECT count(*) FROM pgquota.ledger);
    msg    text;
BEGIN
    FOR c IN SELECT * FROM (VALUES
            ('p_campaign', NULL, 'alice', 's', 'k'),
            ('p_campaign', '', 'alice', 's', 'k'),
            ('p_member', 'sqltest_claim_counted', '', 's', 'k'),
            ('p_member', 'sqltest_claim_counted', NULL, 's', 'k'),
            ('p_member', 'sqltest_claim_counted', repeat('x', 256), 's', 'k'),
            ('p_member', 'sqltest_claim_counted', 'tab' || chr(9), 's', 'k'),
            ('p_member', 'sqltest_claim_counted', 'c1' || chr(133), 's', 'k'),
            ('p_scope', 'sqltest_claim_counted', 'dave', '', 'k'),
            ('p_key', 'sqltest_claim_counted', 'dave', 's', NULL),
            ('p_key', 'sqltest_claim_counted', 'dave', 's', 'nl' || chr(10))
        ) v(param, campaign, member, scope, key) LOOP
        FOR keyed IN 0 .. 1 LOOP
            CONTINUE WHEN keyed = 0 AND c.param IN ('p_scope', 'p_key');
            BEGIN
                IF keyed = 0 THEN
                    PERFORM pgquota.claim(c.campaign, c.member);
                ELSE
                    PERFORM pgquota.claim_keyed(c.scope, c.key, c.campaign, c.member);
                END IF;
                RAISE EXCEPTION 'claim.sql: bad % (keyed %) was accepted', c.param, keyed;
            EXCEPTION WHEN invalid_parameter_value THEN
                GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
                PERFORM pg_temp.expect(position(c.param IN msg) > 0, format('the message names %s: %s', c.param, msg));
            END;
        END LOOP;
    END LOOP;
    PERFORM pg_temp.expect((SELECT count(*) FROM pgquota.voucher_claim) = claims
                           AND (SELECT count(*) FROM pgquota.ledger) = rows, 'bad input writes nothing');
END
$$;

-- Clean up: the campaigns (claims, shards and codes cascade) and the
-- ledger rows of their claims.
DELETE FROM pgquota.ledger WHERE target LIKE 'sqltest\_claim\_%';
DELETE FROM pgquota.voucher_pool WHERE campaign LIKE 'sqltest\_claim\_%';
