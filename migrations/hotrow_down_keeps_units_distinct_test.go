package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// Down-migrating 00005 turns a sharded pool into a counted pool. Its shards
// numbered their units base + 1 .. base + total, so the claims so far need
// not hold the numbers 1 .. claimed; the counted pool then numbers new
// claims claimed + 1, claimed + 2, ... Every unit of a pool must still have
// a distinct number (ClaimResult.Seq, 1 to Total), before and after, and a keyed
// claim's stored outcome must name the unit its member holds.
func TestDownHotrowKeepsUnitNumbersDistinct(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewEmptyURL(t)
	db := openDB(t, dbURL, 2)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.GreaterOrEqual(t, migrations.Latest(), int64(5), "this test down-migrates 00005_hotrow")

	pool := pgtest.Connect(t, dbURL, 4)
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	// 4 units in 2 shards: shard 0 holds units 1-2, shard 1 units 3-4.
	_, err = voucherOf(t, client).CreateShardedCampaign(ctx, "p", 4, 2)
	require.NoError(t, err)
	// While shard 0 is locked, claims skip it and take shard 1's units 3
	// and 4.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgquota.voucher_shard WHERE campaign = 'p' AND shard = 0 FOR UPDATE`)
	require.NoError(t, err)
	for _, m := range []string{"a", "b"} {
		c, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: m})
		require.NoError(t, err)
		require.True(t, c.Claimed)
		require.Greater(t, c.Seq, int64(2), "shard 1's units")
	}
	require.NoError(t, tx.Rollback(ctx))

	// A keyed claim holding unit 3 of a second pool (the claim starts at a
	// random shard, so the pool is made again until it takes shard 1), and
	// an unkeyed one.
	keyed := ""
	for i := 0; keyed == "" && i < 40; i++ {
		camp := fmt.Sprint("k", i)
		_, err = voucherOf(t, client).CreateShardedCampaign(ctx, camp, 4, 2)
		require.NoError(t, err)
		c, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: camp, Member: "x", Idempotency: quota.IdempotencyKey{Key: "key"}})
		require.NoError(t, err)
		if c.Seq == 3 {
			keyed = camp
		}
	}
	require.NotEmpty(t, keyed)
	_, err = voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: keyed, Member: "y"})
	require.NoError(t, err)

	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 4) // 00005_hotrow and every migration after it
	require.NoError(t, err)

	// The pool is a counted pool now, with 2 units left, claimed as a
	// client of the release before 00005 claims it (this release's Claim
	// needs 00015's functions).
	var kind string
	var claimed int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT kind, claimed FROM pgquota.voucher_pool WHERE campaign = 'p'`).Scan(&kind, &claimed))
	require.Equal(t, "counted", kind)
	require.Equal(t, int64(2), claimed)
	claimCounted := func(member string) bool {
		var k, total, cl, now, at any // kind, total, claimed, claimed_now, (seq), claimed_at
		var seq int64
		require.NoError(t, pool.QueryRow(ctx, countedClaimBefore00005, "p", member).Scan(&k, &total, &cl, &now, &seq, &at))
		return seq > 0
	}
	for _, m := range []string{"c", "d"} {
		require.True(t, claimCounted(m), m)
	}
	require.False(t, claimCounted("e"), "sold out")

	rows, err := pool.Query(ctx, `SELECT member, seq FROM pgquota.voucher_claim WHERE campaign = 'p' ORDER BY member`)
	require.NoError(t, err)
	seen := map[int64]string{}
	for rows.Next() {
		var m string
		var seq int64
		require.NoError(t, rows.Scan(&m, &seq))
		if prev, dup := seen[seq]; dup {
			t.Errorf("unit %d is held by both %s and %s", seq, prev, m)
		}
		seen[seq] = m
		require.True(t, seq >= 1 && seq <= 4, fmt.Sprintf("unit %d of 4", seq))
	}
	require.NoError(t, rows.Err())
	require.Len(t, seen, 4)

	// The keyed claim's stored outcome names the unit its member holds.
	var stored, held int64
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT o.seq, c.seq
		FROM pgquota.ledger l
		JOIN pgquota.ledger_outcome o ON o.grant_id = l.grant_id
		JOIN pgquota.voucher_claim c ON c.campaign = l.target AND c.member = l.member
		WHERE l.target = $1 AND l.idempotency_key = 'key'`, keyed).Scan(&stored, &held))
	require.Equal(t, held, stored)
}

// countedClaimBefore00005 is the counted-pool claim statement of the
// releases before 00015 (queries/voucher_claim.sql VoucherClaimCounted),
// which runs on the schema of 00004: $1 campaign, $2 member.
const countedClaimBefore00005 = `
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
	  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')`
