-- Beating the hot row: batched grants (coalesced calls, bulk files) and
-- sharded voucher pools.
--
-- Batched grants need one function, pgquota.greedy_take, that decides a
-- whole batch of grant requests on one counter the way running them one
-- after another would. Sharded pools split a counted pool's total across
-- several rows, so that concurrent claimers lock different rows.

-- +goose Up

-- pgquota.greedy_take returns how many units a batch of grant requests on
-- one counter takes when the requests are decided one after another, in
-- array order, starting from a counter at used: request i is granted when
-- used + (units granted to requests before it) + amounts[i] <= its limit,
-- and denied otherwise (a later, smaller request may still be granted). Its
-- limit is limits[i], or fallback_limit when limits[i] is NULL or negative
-- (the request gave none); a request with no limit at all is denied. 0
-- means the batch grants nothing.
--
-- It is IMMUTABLE (a function of its arguments only), so a statement can
-- evaluate it in the WHERE and SET of the very row version it writes: see
-- queries/usage_batch.sql. The Go side replays the same decisions from the
-- counter's value before and after to hand each request its own outcome
-- (quota/batch.go).
--
-- No overflow: amounts and limits are at most 2^62 - 1 (quota.MaxUnits),
-- and used + taken stays at most max(used, the largest limit), so the sum
-- it tests stays below 2^63.
-- +goose StatementBegin
CREATE FUNCTION pgquota.greedy_take_loop(used bigint, amounts bigint[], limits bigint[], fallback_limit bigint)
    RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    taken bigint := 0;
    lim   bigint;
BEGIN
    IF used IS NULL OR amounts IS NULL THEN
        RETURN 0;
    END IF;
    FOR i IN 1 .. coalesce(array_length(amounts, 1), 0) LOOP
        lim := CASE WHEN limits[i] >= 0 THEN limits[i] ELSE fallback_limit END;
        IF lim IS NOT NULL AND amounts[i] IS NOT NULL AND used + taken + amounts[i] <= lim THEN
            taken := taken + amounts[i];
        END IF;
    END LOOP;
    RETURN taken;
END
$$;
-- +goose StatementEnd

-- The one-request case (a bulk file's rows are mostly one per member) is
-- an expression that PostgreSQL inlines into the calling statement; longer
-- batches run the loop above.
-- +goose StatementBegin
CREATE FUNCTION pgquota.greedy_take(used bigint, amounts bigint[], limits bigint[], fallback_limit bigint)
    RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE
        WHEN cardinality(amounts) = 1 THEN
            CASE WHEN used + amounts[1] <= CASE WHEN limits[1] >= 0 THEN limits[1] ELSE fallback_limit END
                 THEN amounts[1] ELSE 0 END
        ELSE pgquota.greedy_take_loop(used, amounts, limits, fallback_limit)
    END
$$;
-- +goose StatementEnd

-- A sharded pool is a campaign of kind 'sharded': its total is split across
-- voucher_shard rows, and the pool row's claimed stays 0 (as for a code
-- campaign, claims are counted elsewhere so that claimers never queue on
-- the pool row).
ALTER TABLE pgquota.voucher_pool DROP CONSTRAINT voucher_pool_kind;
ALTER TABLE pgquota.voucher_pool ADD CONSTRAINT voucher_pool_kind
    CHECK (kind IN ('counted', 'codes', 'sharded'));

-- One row per shard of a sharded pool: shard is 0 .. K-1, total the
-- shard's share of the pool's total (the totals of a pool's shards add up
-- to the pool's total), claimed the units handed out from it. Unit numbers
-- (voucher_claim.seq) of shard s are base + 1 .. base + total, where base
-- is the sum of the totals of shards 0 .. s-1, so every unit of the pool
-- has a distinct number in 1 .. the pool's total.
CREATE TABLE pgquota.voucher_shard (
    campaign text   NOT NULL REFERENCES pgquota.voucher_pool (campaign) ON DELETE CASCADE,
    shard    integer NOT NULL,
    base     bigint NOT NULL,
    total    bigint NOT NULL,
    claimed  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign, shard),
    CONSTRAINT voucher_shard_shard_nonnegative CHECK (shard >= 0),
    CONSTRAINT voucher_shard_base_nonnegative CHECK (base >= 0),
    CONSTRAINT voucher_shard_total_positive CHECK (total >= 1),
    CONSTRAINT voucher_shard_claimed_in_range CHECK (claimed >= 0 AND claimed <= total)
);

-- pgquota.voucher_shards_left_fresh reports whether any shard of a campaign
-- still has units, read with a fresh snapshot (see pgquota.usage_used_fresh
-- for why a VOLATILE function sees claims that committed while the calling
-- statement ran). A sharded claim calls it only when it handed out nothing,
-- to tell "sold out" from "the shards with units left are locked by claims
-- in progress". It is never a guard.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_shards_left_fresh(p_campaign text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM pgquota.voucher_shard
        WHERE campaign = p_campaign AND claimed < total
    );
END
$$;
-- +goose StatementEnd

-- +goose Down
-- A sharded pool becomes the counted pool it stands for: same total, with
-- the units its shards handed out. Its claims (voucher_claim) stay, but
-- their unit numbers are renumbered 1 .. claimed, keeping their order: the
-- shards numbered units base + 1 .. base + total, so the claims so far
-- need not hold 1 .. claimed, and a counted pool numbers its next claim
-- claimed + 1, which would hand out a number a shard already gave. The
-- ledger's stored claim outcomes follow (updated first, while the claims
-- still carry their old numbers).
UPDATE pgquota.ledger_outcome o
SET seq = r.n
FROM pgquota.ledger l,
     (SELECT c.campaign, c.member, c.seq,
             row_number() OVER (PARTITION BY c.campaign ORDER BY c.seq, c.member) AS n
      FROM pgquota.voucher_claim c
      JOIN pgquota.voucher_pool p ON p.campaign = c.campaign AND p.kind = 'sharded') r
WHERE l.grant_id = o.grant_id
  AND l.operation = 'claim'
  AND l.target = r.campaign
  AND l.member = r.member
  AND o.seq = r.seq
  AND o.seq <> r.n;
UPDATE pgquota.voucher_claim c
SET seq = r.n
FROM (SELECT c.campaign, c.member,
             row_number() OVER (PARTITION BY c.campaign ORDER BY c.seq, c.member) AS n
      FROM pgquota.voucher_claim c
      JOIN pgquota.voucher_pool p ON p.campaign = c.campaign AND p.kind = 'sharded') r
WHERE c.campaign = r.campaign
  AND c.member = r.member
  AND c.seq <> r.n;
UPDATE pgquota.voucher_pool p
SET kind = 'counted',
    claimed = coalesce((SELECT sum(s.claimed) FROM pgquota.voucher_shard s WHERE s.campaign = p.campaign), 0)
WHERE p.kind = 'sharded';
DROP FUNCTION pgquota.voucher_shards_left_fresh(text);
DROP TABLE pgquota.voucher_shard;
ALTER TABLE pgquota.voucher_pool DROP CONSTRAINT voucher_pool_kind;
ALTER TABLE pgquota.voucher_pool ADD CONSTRAINT voucher_pool_kind
    CHECK (kind IN ('counted', 'codes'));
DROP FUNCTION pgquota.greedy_take(bigint, bigint[], bigint[], bigint);
DROP FUNCTION pgquota.greedy_take_loop(bigint, bigint[], bigint[], bigint);
