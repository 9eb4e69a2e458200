package voucher_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// sqlState returns the SQLSTATE of a PostgreSQL error in err's chain.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// shardCounters returns each shard's (total, claimed) of a campaign, by
// shard number.
func (b *testBundle) shardCounters(t *testing.T, campaign string) (totals, claimed []int64) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT total, claimed FROM pgquota.voucher_shard WHERE campaign = $1 ORDER BY shard`, campaign)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var tt, c int64
		require.NoError(t, rows.Scan(&tt, &c))
		totals = append(totals, tt)
		claimed = append(claimed, c)
	}
	require.NoError(t, rows.Err())
	return totals, claimed
}

func TestShardedPool2000Claimers(t *testing.T) {
	t.Parallel()
	const (
		total    = 1000
		shards   = 32
		claimers = 2000
	)
	b := setup(t, 16)
	p, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "flash", total, shards)
	require.NoError(t, err)
	require.Equal(t, voucher.KindSharded, p.Kind)
	require.Equal(t, shards, p.Shards)
	require.Equal(t, int64(total), p.Remaining)

	results := make([]voucher.ClaimResult, claimers)
	errs := make([]error, claimers)
	var mu sync.Mutex
	var early []string
	concurrently(claimers, func(i int) {
		results[i], errs[i] = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "flash", Member: fmt.Sprint("member-", i)})
		if errs[i] == nil && !results[i].Claimed {
			// Sold out must mean sold out: every unit is claimed by now
			// (claims only ever add up, so a later read that finds units
			// left proves the report early).
			st, err := voucherOf(t, b.client).Campaign(b.ctx, "flash")
			for try := 0; sqlState(err) == "53200" && try < 10; try++ {
				// out_of_memory for predicate locks: with the server's
				// default isolation at SERIALIZABLE (one CI pass), 2,000
				// claims and the other tests of a shared server can fill
				// the predicate lock table for a moment.
				time.Sleep(50 * time.Millisecond)
				st, err = voucherOf(t, b.client).Campaign(b.ctx, "flash")
			}
			mu.Lock()
			if err != nil || !st.SoldOut {
				early = append(early, fmt.Sprintf("member-%d: status %+v, %v", i, st, err))
			}
			mu.Unlock()
		}
	})
	require.Empty(t, early, "no claimer reports sold out while units remain")
	var seqs []int64
	for i, r := range results {
		require.NoError(t, errs[i])
		if r.Claimed {
			require.False(t, r.Repeat)
			seqs = append(seqs, r.Seq)
		} else {
			require.Zero(t, r.Seq)
		}
	}
	require.Len(t, seqs, total, "exactly the total is handed out")
	slices.Sort(seqs)
	for i, s := range seqs {
		require.Equal(t, int64(i+1), s, "unit numbers are 1..%d, each once", total)
	}
	require.Equal(t, int64(total), b.CountRows(t, "voucher_claim"))
	totals, claimed := b.shardCounters(t, "flash")
	require.Len(t, totals, shards)
	for i := range totals {
		require.Equal(t, totals[i], claimed[i], "shard %d is full", i)
	}
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "flash")
	require.NoError(t, err)
	require.Equal(t, int64(total), st.Claimed)
	require.True(t, st.SoldOut)
	require.Equal(t, shards, st.Shards)
}

func TestShardedPoolEveryUnitReachable(t *testing.T) {
	t.Parallel()
	// Uneven shards (100 in 32: four of 4, the others 3), claimed one at a
	// time from random starting shards: as shards fill up, the claims fall
	// through to the ones with units left, so every unit goes out before
	// the first sold out; then the same with 33 units, where the last
	// unit sits alone in shard 0.
	for _, total := range []int64{100, 33} {
		t.Run(fmt.Sprint(total), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", total, 32)
			require.NoError(t, err)
			totals, _ := b.shardCounters(t, "p")
			var sum int64
			for _, tt := range totals {
				sum += tt
			}
			require.Equal(t, total, sum, "the shards' totals add up to the pool's")
			for i := range total {
				c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: fmt.Sprint("m", i)})
				require.NoError(t, err)
				require.True(t, c.Claimed, "claim %d of %d", i+1, total)
			}
			c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "late"})
			require.NoError(t, err)
			require.False(t, c.Claimed)
			_, claimed := b.shardCounters(t, "p")
			require.Equal(t, totals, claimed)
		})
	}
}

func TestShardedPoolConcurrentClicks(t *testing.T) {
	t.Parallel()
	const (
		total   = 10
		members = 50
		clicks  = 4
	)
	b := setup(t, 16)
	_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "bf", total, 4)
	require.NoError(t, err)
	results := make([]voucher.ClaimResult, members*clicks)
	errs := make([]error, members*clicks)
	concurrently(members*clicks, func(i int) {
		results[i], errs[i] = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "bf", Member: fmt.Sprintf("m%02d", i%members)})
	})
	seqByMember := map[string]int64{}
	for i, r := range results {
		require.NoError(t, errs[i])
		if !r.Claimed {
			continue
		}
		if s, ok := seqByMember[r.Member]; ok {
			require.Equal(t, s, r.Seq, "a member's repeated clicks return its one unit")
		}
		seqByMember[r.Member] = r.Seq
	}
	require.Len(t, seqByMember, total)
	require.Equal(t, int64(total), b.CountRows(t, "voucher_claim"))
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "bf")
	require.NoError(t, err)
	require.Equal(t, int64(total), st.Claimed)

	again, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "bf", Member: "m00"})
	require.NoError(t, err)
	if s, ok := seqByMember["m00"]; ok {
		require.True(t, again.Repeat)
		require.Equal(t, s, again.Seq)
	} else {
		require.False(t, again.Claimed)
	}
}

func TestShardedPoolWaitsForLockedShards(t *testing.T) {
	t.Parallel()
	// Two units in two shards. A transaction claims one and stays open;
	// a second claim skips its shard and takes the other; a third finds the
	// only shard with a unit left locked, waits, and gets the unit when
	// the transaction rolls back, or sold out when it commits.
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprint("commit ", commit), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4)
			_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 2, 2)
			require.NoError(t, err)
			tx, err := b.pool.BeginTx(b.ctx, readCommitted)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			held, err := voucherOf(t, b.client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "p", Member: "holder"})
			require.NoError(t, err)
			require.True(t, held.Claimed)

			second, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "second"})
			require.NoError(t, err)
			require.True(t, second.Claimed, "a locked shard is skipped, not waited for, while another has units")
			require.NotEqual(t, held.Seq, second.Seq)

			done := make(chan voucher.ClaimResult, 1)
			go func() {
				c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "third"})
				if err != nil {
					t.Errorf("third claim: %v", err)
				}
				done <- c
			}()
			b.WaitForLockWaits(t, 1)
			if commit {
				require.NoError(t, tx.Commit(b.ctx))
			} else {
				require.NoError(t, tx.Rollback(b.ctx))
			}
			third := <-done
			if commit {
				require.False(t, third.Claimed, "sold out once the holder committed")
			} else {
				require.True(t, third.Claimed, "the rolled-back unit goes to the waiting claim")
				require.Equal(t, held.Seq, third.Seq)
			}
			st, err := voucherOf(t, b.client).Campaign(b.ctx, "p")
			require.NoError(t, err)
			require.Equal(t, int64(2), st.Claimed)
		})
	}
}

func TestShardedPoolCreateAndKinds(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	var ie *quota.InputError
	for _, tc := range []struct {
		campaign string
		total    int64
		shards   int
		field    string
	}{
		{"", 10, 2, "campaign"},
		{"p", 0, 1, "total"},
		{"p", 10, 0, "shards"},
		{"p", 10, 11, "shards"},
		{"p", 5000, voucher.MaxShards + 1, "shards"},
	} {
		_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, tc.campaign, tc.total, tc.shards)
		require.ErrorAs(t, err, &ie, "%+v", tc)
		require.Equal(t, tc.field, ie.Field)
	}
	require.Zero(t, b.CountRows(t, "voucher_pool"))

	p, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 10, 3)
	require.NoError(t, err)
	require.Equal(t, 3, p.Shards)
	totals, _ := b.shardCounters(t, "p")
	require.Equal(t, []int64{4, 3, 3}, totals)
	again, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 10, 3)
	require.NoError(t, err, "a repeated create is not an error")
	require.Equal(t, p.CreatedAt, again.CreatedAt)
	_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 10, 4)
	require.ErrorIs(t, err, voucher.ErrCampaignExists)
	_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 11, 3)
	require.ErrorIs(t, err, voucher.ErrCampaignExists)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "p", 10)
	require.ErrorIs(t, err, voucher.ErrCampaignExists)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "p", []string{"x"})
	require.ErrorIs(t, err, voucher.ErrCampaignExists)

	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 10)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "counted", 10, 2)
	require.ErrorIs(t, err, voucher.ErrCampaignExists)

	// The unit numbers of each shard are a consecutive range.
	seen := map[int64]bool{}
	for i := range 10 {
		c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: fmt.Sprint("m", i)})
		require.NoError(t, err)
		require.True(t, c.Claimed)
		require.GreaterOrEqual(t, c.Seq, int64(1))
		require.LessOrEqual(t, c.Seq, int64(10))
		require.False(t, seen[c.Seq])
		seen[c.Seq] = true
	}

	// A fresh client learns the kind from its first claim.
	fresh, err := quota.New(b.pool, nil)
	require.NoError(t, err)
	c, err := voucherOf(t, fresh).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "m3"})
	require.NoError(t, err)
	require.True(t, c.Repeat)
	c, err = voucherOf(t, fresh).Claim(context.Background(), voucher.ClaimRequest{Campaign: "p", Member: "other"})
	require.NoError(t, err)
	require.False(t, c.Claimed)
}

func TestShardedPoolKeyedClaims(t *testing.T) {
	t.Parallel()
	// 30 units in 8 shards; 60 members claim with a key each, every claim
	// sent 3 times at once (retries racing the first attempt): 30 members
	// hold a unit, each key is decided once with its own ledger entry, the
	// copies replay it, and sold-out outcomes are stored and replayed too.
	const (
		total   = 30
		members = 60
		copies  = 3
	)
	b := setup(t, 16)
	_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", total, 8)
	require.NoError(t, err)
	results := make([]voucher.ClaimResult, members*copies)
	errs := make([]error, members*copies)
	concurrently(members*copies, func(i int) {
		m := i % members
		results[i], errs[i] = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: fmt.Sprint("m", m), Idempotency: quota.IdempotencyKey{Key: fmt.Sprint("click-", m)}})
	})
	held := 0
	byMember := map[string][]voucher.ClaimResult{}
	for i, r := range results {
		require.NoError(t, errs[i])
		byMember[r.Member] = append(byMember[r.Member], r)
	}
	seqs := map[int64]bool{}
	for m, rs := range byMember {
		decided := 0
		for _, r := range rs {
			if !r.Replayed {
				decided++
			}
			require.Equal(t, rs[0].GrantID, r.GrantID, m)
			require.Equal(t, rs[0].Claimed, r.Claimed, m)
			require.Equal(t, rs[0].Seq, r.Seq, m)
		}
		require.Equal(t, 1, decided, "member %s's key is decided once", m)
		if rs[0].Claimed {
			held++
			require.False(t, seqs[rs[0].Seq])
			seqs[rs[0].Seq] = true
		}
	}
	require.Equal(t, total, held)
	require.Equal(t, int64(members), b.LedgerRows(t))
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "p")
	require.NoError(t, err)
	require.Equal(t, int64(total), st.Claimed)

	// A fresh client (no cached kind) replays.
	fresh, err := quota.New(b.pool, nil)
	require.NoError(t, err)
	r, err := voucherOf(t, fresh).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "m0", Idempotency: quota.IdempotencyKey{Key: "click-0"}})
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.Equal(t, byMember["m0"][0].GrantID, r.GrantID)
	_, err = voucherOf(t, fresh).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "m1", Idempotency: quota.IdempotencyKey{Key: "click-0"}})
	require.ErrorIs(t, err, quota.ErrIdempotencyKeyReused)
}

func TestShardedClaimsInFlight(t *testing.T) {
	t.Parallel()
	// Two units in two shards; a transaction holds one shard's claim open
	// and a second claim takes the other shard, so every shard with a unit
	// left is locked. With one claim in flight allowed, a third claim waits
	// for the locked shard inside the database, and a fourth waits in the
	// client: its context ends there, and it wrote nothing; a fifth waits in
	// the client for 100ms, then goes ahead. Without the bound (-1), claims
	// wait in the database at once.
	for _, bound := range []int{1, -1} {
		t.Run(fmt.Sprint("bound ", bound), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 6)
			client, err := quota.New(b.pool, nil)
			voucherWith(t, client, &voucher.Config{ShardedClaimsInFlight: bound})
			require.NoError(t, err)
			_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "p", 2, 2)
			require.NoError(t, err)
			tx, err := b.pool.BeginTx(b.ctx, readCommitted)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			held, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "p", Member: "holder"})
			require.NoError(t, err)
			require.True(t, held.Claimed)
			second, err := voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "second"})
			require.NoError(t, err)
			require.True(t, second.Claimed)

			third := claimAsync(t, b.ctx, client, "p", "third")
			b.WaitForLockWaits(t, 1)

			if bound == 1 {
				// A claim whose context ends while it waits at the gate
				// returns the context's error and writes nothing.
				ctx, cancel := context.WithCancel(b.ctx)
				fourthErr := make(chan error, 1)
				go func() {
					_, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: "fourth"})
					fourthErr <- err
				}()
				time.Sleep(30 * time.Millisecond)
				cancel()
				require.ErrorIs(t, <-fourthErr, context.Canceled)

				// One that keeps waiting is held at the gate for
				// shardGateMaxWait (100ms), then goes ahead without a
				// place: the third claim may wait for an open transaction
				// for any length of time.
				fifth := claimAsync(t, b.ctx, client, "p", "fifth")
				time.Sleep(50 * time.Millisecond)
				require.Equal(t, 1, b.LockWaits(t), "only the admitted claim waits in the database")
				b.WaitForLockWaits(t, 2)
				require.NoError(t, tx.Rollback(b.ctx))
				a, c := <-third, <-fifth
				require.True(t, a.Claimed != c.Claimed, "one of the two waiting claims gets the rolled-back unit")
			} else {
				fourth := claimAsync(t, b.ctx, client, "p", "fourth")
				b.WaitForLockWaits(t, 2)
				require.NoError(t, tx.Rollback(b.ctx))
				a, c := <-third, <-fourth
				require.True(t, a.Claimed != c.Claimed, "one of the two waiting claims gets the rolled-back unit")
			}
			var members []string
			rows, err := b.pool.Query(b.ctx, `SELECT member FROM pgquota.voucher_claim WHERE campaign = 'p' ORDER BY member`)
			require.NoError(t, err)
			for rows.Next() {
				var m string
				require.NoError(t, rows.Scan(&m))
				members = append(members, m)
			}
			require.NoError(t, rows.Err())
			require.Len(t, members, 2)
			require.Contains(t, members, "second")
			require.NotContains(t, members, "fourth", "a claim given up at the gate wrote nothing")
			require.NotContains(t, members, "holder", "the holder's transaction rolled back")
			st, err := voucherOf(t, client).Campaign(b.ctx, "p")
			require.NoError(t, err)
			require.Equal(t, int64(2), st.Claimed)
			require.True(t, st.SoldOut)
		})
	}
}

// claimAsync runs Claim in a goroutine and returns where its claim
// arrives; an error fails the test.
func claimAsync(t *testing.T, ctx context.Context, client *quota.Client, campaign, member string) <-chan voucher.ClaimResult {
	t.Helper()
	out := make(chan voucher.ClaimResult, 1)
	go func() {
		c, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: campaign, Member: member})
		if err != nil {
			t.Errorf("%s's claim: %v", member, err)
		}
		out <- c
	}()
	return out
}
