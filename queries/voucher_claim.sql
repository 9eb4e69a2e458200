-- name: VoucherClaim :one
-- Claims one voucher of a campaign of any kind (counted, sharded, codes)
-- for a member: pgquota.claim (migrations/00015_sql_claims.sql) documents
-- the columns and why the claim is exact.
SELECT c.found::boolean AS found,
       c.kind::text AS kind,
       c.total::bigint AS total,
       c.claimed::boolean AS claimed,
       c.repeat::boolean AS repeat,
       c.seq::bigint AS seq,
       c.code::text AS code,
       c.claimed_at::timestamptz AS claimed_at,
       c.busy::boolean AS busy,
       c.shards::integer AS shards
FROM pgquota.claim(@campaign::text, @member::text) c;

-- name: VoucherClaimGet :one
SELECT campaign, member, seq, code, claimed_at
FROM pgquota.voucher_claim
WHERE campaign = @campaign::text AND member = @member::text;
