-- Vouchers: counted pools (a total and a claimed counter) and code campaigns
-- (pre-loaded distinct codes). Either way a member holds at most one claim
-- per campaign.

-- +goose Up
-- For a counted pool, claimed is the number of units handed out and the
-- claim path is the only writer. For a code campaign, total is the number of
-- codes imported and claimed stays 0: claims are counted from voucher_claim,
-- so that concurrent claimers never queue on this row.
CREATE TABLE pgquota.voucher_pool (
    campaign   text        NOT NULL PRIMARY KEY,
    kind       text        NOT NULL,
    total      bigint      NOT NULL DEFAULT 0,
    claimed    bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT voucher_pool_campaign_length CHECK (octet_length(campaign) BETWEEN 1 AND 255),
    CONSTRAINT voucher_pool_kind CHECK (kind IN ('counted', 'codes')),
    CONSTRAINT voucher_pool_total_nonnegative CHECK (total >= 0),
    CONSTRAINT voucher_pool_claimed_in_range CHECK (claimed >= 0 AND claimed <= total)
);

-- One row per member who holds a voucher of the campaign. The primary key is
-- what makes a double-click return the first claim. For a counted pool seq is
-- the unit's number (1 for the first unit handed out); for a code campaign
-- code is the code the member holds.
CREATE TABLE pgquota.voucher_claim (
    campaign   text        NOT NULL REFERENCES pgquota.voucher_pool (campaign) ON DELETE CASCADE,
    member     text        NOT NULL,
    seq        bigint,
    code       text,
    claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (campaign, member),
    CONSTRAINT voucher_claim_member_length CHECK (octet_length(member) BETWEEN 1 AND 255),
    CONSTRAINT voucher_claim_seq_positive CHECK (seq >= 1),
    CONSTRAINT voucher_claim_seq_or_code CHECK ((seq IS NULL) <> (code IS NULL))
);

-- A pre-loaded code. member and claimed_at are set together when the code is
-- handed out.
CREATE TABLE pgquota.voucher_code (
    campaign   text        NOT NULL REFERENCES pgquota.voucher_pool (campaign) ON DELETE CASCADE,
    code       text        NOT NULL,
    member     text,
    claimed_at timestamptz,
    PRIMARY KEY (campaign, code),
    CONSTRAINT voucher_code_one_per_member UNIQUE (campaign, member),
    CONSTRAINT voucher_code_code_length CHECK (octet_length(code) BETWEEN 1 AND 255),
    CONSTRAINT voucher_code_claim_complete CHECK ((member IS NULL) = (claimed_at IS NULL))
);

-- Unclaimed codes, for the claim's FOR UPDATE SKIP LOCKED pick and the
-- "any left?" probe.
CREATE INDEX voucher_code_unclaimed ON pgquota.voucher_code (campaign, code) WHERE member IS NULL;

-- Fresh reads (see pgquota.usage_used_fresh): a claim calls them only when
-- it did not hand out a unit, to tell "you already hold one" and "codes are
-- left but all are being claimed right now" from "sold out", including
-- claims that committed while the statement ran.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_claim_fresh(p_campaign text, p_member text)
    RETURNS pgquota.voucher_claim
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    c pgquota.voucher_claim;
BEGIN
    SELECT * INTO c FROM pgquota.voucher_claim
    WHERE campaign = p_campaign AND member = p_member;
    RETURN c;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_codes_left_fresh(p_campaign text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM pgquota.voucher_code
        WHERE campaign = p_campaign AND member IS NULL
    );
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.voucher_codes_left_fresh(text);
DROP FUNCTION pgquota.voucher_claim_fresh(text, text);
DROP TABLE pgquota.voucher_code;
DROP TABLE pgquota.voucher_claim;
DROP TABLE pgquota.voucher_pool;
