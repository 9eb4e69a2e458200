package voucher_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// oldCountedClaimSQL is the counted-pool claim statement that
// pgquota.claim_counted (migrations/00015_sql_claims.sql) replaced
// (queries/voucher_claim.sql VoucherClaimCounted, before 00015): $1
// campaign, $2 member.
const oldCountedClaimSQL = `
	WITH pool AS (
	    SELECT p.campaign, p.claimed
	    FROM pgquota.voucher_pool p
	    WHERE p.campaign = $1::text
	      AND p.kind = 'counted'
	      AND p.claimed < p.total
	      AND NOT EXISTS (
	          SELECT 1 FROM pgquota.voucher_claim c
	          WHERE c.campaign = $1::text AND c.member = $2::text
	      )
	    FOR UPDATE OF p
	), ins AS (
	    INSERT INTO pgquota.voucher_claim (campaign, member, seq, claimed_at)
	    SELECT pool.campaign, $2::text, pool.claimed + 1, pgquota.clock()
	    FROM pool
	    ON CONFLICT (campaign, member) DO NOTHING
	    RETURNING seq, claimed_at
	), upd AS (
	    UPDATE pgquota.voucher_pool p
	    SET claimed = p.claimed + 1
	    FROM ins
	    WHERE p.campaign = $1::text
	    RETURNING p.claimed
	), prior AS (
	    SELECT f.seq, f.code, f.member, f.claimed_at
	    FROM pgquota.voucher_claim_fresh($1::text, $2::text) f
	    WHERE NOT EXISTS (SELECT 1 FROM ins)
	)
	SELECT p.kind,
	       p.total,
	       coalesce((SELECT upd.claimed FROM upd), p.claimed)::bigint AS claimed,
	       EXISTS (SELECT 1 FROM ins)::boolean AS claimed_now,
	       coalesce((SELECT ins.seq FROM ins), (SELECT prior.seq FROM prior), 0)::bigint AS seq,
	       coalesce((SELECT ins.claimed_at FROM ins), (SELECT prior.claimed_at FROM prior))::timestamptz AS claimed_at
	FROM pgquota.voucher_pool p
	WHERE p.campaign = $1::text
	  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');`

// oldShardedClaimSQL is the sharded-pool claim statement that
// pgquota.claim_sharded replaced (queries/voucher_shard.sql
// VoucherShardClaim, before 00015): $1 campaign, $2 member, $3 the shard
// to start from (the caller drew it, knowing the number of shards).
const oldShardedClaimSQL = `
	WITH held AS (
	    SELECT EXISTS (
	        SELECT 1 FROM pgquota.voucher_claim c
	        WHERE c.campaign = $1::text AND c.member = $2::text
	    ) AS yes
	), skip_from AS (
	    SELECT s.campaign, s.shard, s.base, s.claimed
	    FROM pgquota.voucher_shard s
	    WHERE s.campaign = $1::text
	      AND s.shard >= $3::integer
	      AND s.claimed < s.total
	      AND NOT (SELECT yes FROM held)
	    ORDER BY s.shard
	    LIMIT 1
	    FOR UPDATE OF s SKIP LOCKED
	), skip_before AS (
	    SELECT s.campaign, s.shard, s.base, s.claimed
	    FROM pgquota.voucher_shard s
	    WHERE s.campaign = $1::text
	      AND s.shard < $3::integer
	      AND s.claimed < s.total
	      AND NOT (SELECT yes FROM held)
	      AND NOT EXISTS (SELECT 1 FROM skip_from)
	    ORDER BY s.shard
	    LIMIT 1
	    FOR UPDATE OF s SKIP LOCKED
	), wait_from AS (
	    SELECT s.campaign, s.shard, s.base, s.claimed
	    FROM pgquota.voucher_shard s
	    WHERE s.campaign = $1::text
	      AND s.shard >= $3::integer
	      AND s.claimed < s.total
	      AND NOT (SELECT yes FROM held)
	      AND NOT EXISTS (SELECT 1 FROM skip_from)
	      AND NOT EXISTS (SELECT 1 FROM skip_before)
	    ORDER BY s.shard
	    LIMIT 1
	    FOR UPDATE OF s
	), wait_before AS (
	    SELECT s.campaign, s.shard, s.base, s.claimed
	    FROM pgquota.voucher_shard s
	    WHERE s.campaign = $1::text
	      AND s.shard < $3::integer
	      AND s.claimed < s.total
	      AND NOT (SELECT yes FROM held)
	      AND NOT EXISTS (SELECT 1 FROM skip_from)
	      AND NOT EXISTS (SELECT 1 FROM skip_before)
	      AND NOT EXISTS (SELECT 1 FROM wait_from)
	    ORDER BY s.shard
	    LIMIT 1
	    FOR UPDATE OF s
	), pick AS (
	    SELECT * FROM skip_from
	    UNION ALL
	    SELECT * FROM skip_before
	    UNION ALL
	    SELECT * FROM wait_from
	    UNION ALL
	    SELECT * FROM wait_before
	), ins AS (
	    INSERT INTO pgquota.voucher_claim (campaign, member, seq, claimed_at)
	    SELECT pick.campaign, $2::text, pick.base + pick.claimed + 1, pgquota.clock()
	    FROM pick
	    ON CONFLICT (campaign, member) DO NOTHING
	    RETURNING seq, claimed_at
	), upd AS (
	    UPDATE pgquota.voucher_shard s
	    SET claimed = s.claimed + 1
	    FROM pick, ins
	    WHERE s.campaign = pick.campaign AND s.shard = pick.shard
	    RETURNING s.shard
	), prior AS (
	    SELECT f.seq, f.code, f.member, f.claimed_at
	    FROM pgquota.voucher_claim_fresh($1::text, $2::text) f
	    WHERE NOT EXISTS (SELECT 1 FROM ins)
	)
	SELECT p.kind,
	       p.total,
	       EXISTS (SELECT 1 FROM upd)::boolean AS claimed_now,
	       coalesce((SELECT ins.seq FROM ins), (SELECT prior.seq FROM prior), 0)::bigint AS seq,
	       coalesce((SELECT ins.claimed_at FROM ins), (SELECT prior.claimed_at FROM prior))::timestamptz AS claimed_at,
	       (NOT EXISTS (SELECT 1 FROM ins)
	        AND NOT EXISTS (SELECT 1 FROM prior WHERE prior.member IS NOT NULL)
	        AND p.kind = 'sharded'
	        AND pgquota.voucher_shards_left_fresh($1::text))::boolean AS units_left
	FROM pgquota.voucher_pool p
	WHERE p.campaign = $1::text
	  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');`

// BenchmarkClaimFunctionVsStatement compares, in one run, a claim through
// the one-statement SQL that 00015 replaced and through pgquota.claim, on a
// counted pool and on a pool of 32 shards, with 1 and 32 goroutines on as
// many connections, a new member every call (both sent as one statement on
// pgx, no Client in between). It reports claims/s; new/old is the ratio of
// the "fn" and "stmt" figures of one kind and client count. Committed
// claims wait for their commit's WAL flush, which dominates on most disks;
// the "rollback" runs send each claim inside a transaction that is rolled
// back (BEGIN, claim, ROLLBACK: no flush), which measures what the server
// spends on the claim itself.
//
//	go test ./quota -run '^$' -bench ClaimFunctionVsStatement -benchtime 3s
func BenchmarkClaimFunctionVsStatement(b *testing.B) {
	const shards = 32
	url := pgtest.NewURL(b)
	setup, err := quota.New(pgtest.ConnectOperator(b, url, 2), nil)
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	for _, kind := range []string{"counted", "sharded"} {
		for _, clients := range []int{1, 32} {
			for _, end := range []string{"commit", "rollback"} {
				for _, impl := range []string{"stmt", "fn"} {
					b.Run(fmt.Sprintf("%s/clients=%d/%s/%s", kind, clients, end, impl), func(b *testing.B) {
						ctx := context.Background()
						campaign := fmt.Sprint("bench-", seq.Add(1))
						if kind == "counted" {
							_, err = voucherOf(b, setup).CreateCampaign(ctx, campaign, quota.MaxUnits)
						} else {
							_, err = voucherOf(b, setup).CreateShardedCampaign(ctx, campaign, quota.MaxUnits, shards)
						}
						if err != nil {
							b.Fatal(err)
						}
						pool := pgtest.Connect(b, url, int32(clients))
						runClients(b, clients, func(ctx context.Context, i int64) error {
							member := "m" + strconv.FormatInt(i, 10)
							x := pgxExec(pool)
							if end == "rollback" {
								tx, err := pool.Begin(ctx)
								if err != nil {
									return err
								}
								defer func() { _ = tx.Rollback(ctx) }()
								x = tx
							}
							var err error
							switch {
							case impl == "fn":
								_, err = x.Exec(ctx, `SELECT * FROM pgquota.claim($1, $2)`, campaign, member)
							case kind == "counted":
								_, err = x.Exec(ctx, oldCountedClaimSQL, campaign, member)
							default:
								_, err = x.Exec(ctx, oldShardedClaimSQL, campaign, member, int32(rand.IntN(shards)))
							}
							return err
						})
						want := int64(b.N)
						if end == "rollback" {
							want = 0
						}
						var claims int64
						if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.voucher_claim WHERE campaign = $1`, campaign).Scan(&claims); err != nil {
							b.Fatal(err)
						}
						if claims != want {
							b.Fatalf("%d calls (%s) left %d claims, want %d", b.N, end, claims, want)
						}
						b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
					})
				}
			}
		}
	}
}

// pgxExec is what the benchmark sends a claim on: the pool, or a
// transaction.
type pgxExec interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}
