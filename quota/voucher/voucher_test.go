package voucher_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// codeList returns n distinct codes: prefix-000, prefix-001, ...
func codeList(prefix string, n int) []string {
	codes := make([]string, n)
	for i := range codes {
		codes[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return codes
}

// waitClient returns a client on b's pool whose Claim waits up to d for
// locked codes, so that a loaded test machine never turns a slow commit into
// ErrCodesBusy.
func (b *testBundle) waitClient(t *testing.T, d time.Duration) *quota.Client {
	t.Helper()
	c, err := quota.New(b.pool, nil)
	voucherWith(t, c, &voucher.Config{CodeClaimWait: d})
	require.NoError(t, err)
	return c
}

func TestVoucherPoolConcurrentClicks(t *testing.T) {
	t.Parallel()
	const (
		total   = 10
		members = 50
		clicks  = 4
	)
	b := setup(t, 16)
	p, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "bf", total)
	require.NoError(t, err)
	require.Equal(t, voucher.KindCounted, p.Kind)
	require.Equal(t, int64(total), p.Total)
	require.Zero(t, p.Claimed)

	results := make([]voucher.ClaimResult, members*clicks)
	errs := make([]error, members*clicks)
	concurrently(members*clicks, func(i int) {
		results[i], errs[i] = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "bf", Member: fmt.Sprintf("m%02d", i%members)})
	})

	byMember := map[string][]voucher.ClaimResult{}
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, "bf", r.Campaign)
		require.Equal(t, int64(total), r.Total)
		require.Empty(t, r.Code)
		byMember[r.Member] = append(byMember[r.Member], r)
	}
	require.Len(t, byMember, members)

	var seqs []int64
	for m, rs := range byMember {
		require.Len(t, rs, clicks)
		var firsts, claimed int
		var seq int64
		for _, r := range rs {
			if !r.Claimed {
				require.Zero(t, r.Seq, "member %s: a sold-out result carries no unit", m)
				require.False(t, r.Repeat)
				continue
			}
			claimed++
			if !r.Repeat {
				firsts++
			}
			if seq == 0 {
				seq = r.Seq
			}
			require.Equal(t, seq, r.Seq, "member %s: every click reports the same unit", m)
			require.False(t, r.ClaimedAt.IsZero())
		}
		switch claimed {
		case 0:
			// Sold out on every click.
		case clicks:
			require.Equal(t, 1, firsts, "member %s: exactly one click took the unit, the others repeat it", m)
			seqs = append(seqs, seq)
		default:
			t.Fatalf("member %s: %d of %d clicks claimed; a member who holds a unit must see it on every click", m, claimed, clicks)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	want := make([]int64, total)
	for i := range want {
		want[i] = int64(i + 1)
	}
	require.Equal(t, want, seqs, "exactly %d members hold a unit, numbered 1..%d", total, total)

	// The database agrees: the counter, one claim row per winner.
	var claimed int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT claimed FROM pgquota.voucher_pool WHERE campaign = 'bf'`).Scan(&claimed))
	require.Equal(t, int64(total), claimed)
	require.Equal(t, int64(total), b.CountRows(t, "voucher_claim"))
	var distinctMembers int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT member) FROM pgquota.voucher_claim`).Scan(&distinctMembers))
	require.Equal(t, int64(total), distinctMembers)

	st, err := voucherOf(t, b.client).Campaign(b.ctx, "bf")
	require.NoError(t, err)
	require.Equal(t, voucher.Campaign{Name: "bf", Kind: voucher.KindCounted, Total: total, Claimed: total, Remaining: 0, SoldOut: true, CreatedAt: st.CreatedAt}, st)

	// A newcomer finds it sold out; a winner clicking later sees the first
	// claim again.
	c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "bf", Member: "late"})
	require.NoError(t, err)
	require.False(t, c.Claimed)
	require.False(t, c.Repeat)
	require.Zero(t, c.Seq)
	for m, rs := range byMember {
		if !rs[0].Claimed {
			continue
		}
		again, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "bf", Member: m})
		require.NoError(t, err)
		require.True(t, again.Claimed)
		require.True(t, again.Repeat)
		require.Equal(t, rs[0].Seq, again.Seq)
		require.True(t, rs[0].ClaimedAt.Equal(again.ClaimedAt))
	}
	require.Equal(t, int64(total), b.CountRows(t, "voucher_claim"))
}

func TestVoucherPoolSequential(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "p", 2)
	require.NoError(t, err)

	c1, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "alice"})
	require.NoError(t, err)
	require.True(t, c1.Claimed)
	require.False(t, c1.Repeat)
	require.Equal(t, int64(1), c1.Seq)

	again, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "alice"})
	require.NoError(t, err)
	require.True(t, again.Repeat)
	require.Equal(t, int64(1), again.Seq)

	c2, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "bob"})
	require.NoError(t, err)
	require.Equal(t, int64(2), c2.Seq)

	out, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "carol"})
	require.NoError(t, err)
	require.False(t, out.Claimed)
	// A holder's repeat still works on a sold-out pool.
	again, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "p", Member: "bob"})
	require.NoError(t, err)
	require.True(t, again.Claimed)
	require.True(t, again.Repeat)
	require.Equal(t, int64(2), again.Seq)

	// A claim inside a rolled-back transaction leaves the unit in the pool.
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "tx", 1)
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	c, err := voucherOf(t, b.client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "tx", Member: "dave"})
	require.NoError(t, err)
	require.True(t, c.Claimed)
	require.NoError(t, tx.Rollback(b.ctx))
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "tx")
	require.NoError(t, err)
	require.Zero(t, st.Claimed)
	require.False(t, st.SoldOut)
	c, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "tx", Member: "erin"})
	require.NoError(t, err)
	require.Equal(t, int64(1), c.Seq)
}

func TestVoucherCampaignErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	p, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 5)
	require.NoError(t, err)
	// The same create again is not an error and changes nothing.
	again, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 5)
	require.NoError(t, err)
	require.Equal(t, p, again)
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "counted", Member: "m"})
	require.NoError(t, err)
	again, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 5)
	require.NoError(t, err)
	require.Equal(t, int64(1), again.Claimed)
	// Another total is.
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 6)
	require.ErrorIs(t, err, voucher.ErrCampaignExists)

	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{"a", "b"})
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "codes", 2)
	require.ErrorIs(t, err, voucher.ErrCampaignExists, "a code campaign is not a counted pool, whatever its total")
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "counted", []string{"x"})
	require.ErrorIs(t, err, voucher.ErrCampaignExists)

	var unclaimed int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.voucher_code WHERE member IS NULL`).Scan(&unclaimed))
	require.Equal(t, int64(2), unclaimed)

	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "nope", Member: "m"})
	require.ErrorIs(t, err, voucher.ErrCampaignNotFound)
	_, err = voucherOf(t, b.client).Campaign(b.ctx, "nope")
	require.ErrorIs(t, err, voucher.ErrCampaignNotFound)
	require.Zero(t, b.countRowsWhere(t, "voucher_pool", "campaign = 'nope'"))
}

// countRowsWhere counts the rows of a pgquota table that match cond.
func (b *testBundle) countRowsWhere(t *testing.T, table, cond string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.`+table+` WHERE `+cond).Scan(&n))
	return n
}

func TestImportCodes(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	codes := codeList("c", 100)
	input := append(append([]string{}, codes...), codes[3], codes[7], codes[3]) // three repeats
	res, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "spring", input)
	require.NoError(t, err)
	require.Equal(t, voucher.ImportResult{Campaign: "spring", Imported: 100, Duplicates: 3, Total: 100}, res)

	// Re-import: 50 known codes and 20 new ones.
	input = append(append([]string{}, codes[:50]...), codeList("d", 20)...)
	res, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "spring", input)
	require.NoError(t, err)
	require.Equal(t, voucher.ImportResult{Campaign: "spring", Imported: 20, Duplicates: 50, Total: 120}, res)

	// Only duplicates.
	res, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "spring", codes[:5])
	require.NoError(t, err)
	require.Equal(t, voucher.ImportResult{Campaign: "spring", Imported: 0, Duplicates: 5, Total: 120}, res)

	require.Equal(t, int64(120), b.CountRows(t, "voucher_code"))
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "spring")
	require.NoError(t, err)
	require.Equal(t, voucher.KindCodes, st.Kind)
	require.Equal(t, int64(120), st.Total)
	require.Zero(t, st.Claimed)
	require.Equal(t, int64(120), st.Remaining)
	require.False(t, st.SoldOut)

	// The same codes in another campaign are other codes.
	res, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "autumn", codes[:10])
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Imported)

	// A campaign's claims show in its status.
	for i := range 7 {
		c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "autumn", Member: fmt.Sprintf("m%d", i)})
		require.NoError(t, err)
		require.True(t, c.Claimed)
	}
	st, err = voucherOf(t, b.client).Campaign(b.ctx, "autumn")
	require.NoError(t, err)
	require.Equal(t, voucher.Campaign{Name: "autumn", Kind: voucher.KindCodes, Total: 10, Claimed: 7, Remaining: 3, CreatedAt: st.CreatedAt}, st)

	// Importing more codes into a partly claimed campaign keeps the claims.
	res, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "autumn", codeList("e", 5))
	require.NoError(t, err)
	require.Equal(t, int64(15), res.Total)
	st, err = voucherOf(t, b.client).Campaign(b.ctx, "autumn")
	require.NoError(t, err)
	require.Equal(t, int64(7), st.Claimed)
	require.Equal(t, int64(8), st.Remaining)
}

func TestImportCodesTxRollback(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	tx, err := b.operator.Pool().Begin(b.ctx)
	require.NoError(t, err)
	res, err := voucherOf(t, b.operator).ImportCodesTx(b.ctx, tx, "rolled", codeList("r", 50))
	require.NoError(t, err)
	require.Equal(t, int64(50), res.Imported)
	// Twice in one transaction: the staging table does not linger.
	res, err = voucherOf(t, b.operator).ImportCodesTx(b.ctx, tx, "rolled", codeList("s", 5))
	require.NoError(t, err)
	require.Equal(t, int64(55), res.Total)
	require.NoError(t, tx.Rollback(b.ctx))

	for _, table := range []string{"voucher_pool", "voucher_code", "voucher_claim"} {
		require.Zero(t, b.CountRows(t, table), table)
	}
	_, err = voucherOf(t, b.client).Campaign(b.ctx, "rolled")
	require.ErrorIs(t, err, voucher.ErrCampaignNotFound)

	// Committed, it is there.
	tx, err = b.operator.Pool().Begin(b.ctx)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).ImportCodesTx(b.ctx, tx, "kept", codeList("k", 3))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, int64(3), b.CountRows(t, "voucher_code"))
}

// claimCodes runs n concurrent Claim calls by distinct members and
// checks the invariants every run must keep: no code twice, no member
// twice, every code handed out belongs to the campaign, and the database
// agrees with what the callers were told. It returns the number of codes
// handed out.
func claimCodes(t *testing.T, b *testBundle, claim func(i int, member string) (voucher.ClaimResult, error), campaign string, codes []string, n int) int {
	t.Helper()
	results := make([]voucher.ClaimResult, n)
	errs := make([]error, n)
	concurrently(n, func(i int) {
		results[i], errs[i] = claim(i, fmt.Sprintf("member-%03d", i))
	})
	known := map[string]bool{}
	for _, c := range codes {
		known[c] = true
	}
	holder := map[string]string{} // code -> member
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, int64(len(codes)), r.Total)
		require.False(t, r.Repeat)
		require.Zero(t, r.Seq)
		if !r.Claimed {
			require.Empty(t, r.Code)
			continue
		}
		require.True(t, known[r.Code], "code %q is not one of the campaign's", r.Code)
		prev, dup := holder[r.Code]
		require.False(t, dup, "code %q handed to %s and %s", r.Code, prev, r.Member)
		holder[r.Code] = r.Member
	}

	rows, err := b.pool.Query(b.ctx, `SELECT code, member FROM pgquota.voucher_code WHERE campaign = $1 AND member IS NOT NULL`, campaign)
	require.NoError(t, err)
	dbHolder := map[string]string{}
	for rows.Next() {
		var code, member string
		require.NoError(t, rows.Scan(&code, &member))
		dbHolder[code] = member
	}
	require.NoError(t, rows.Err())
	require.Equal(t, holder, dbHolder, "the codes marked in the database are exactly those reported")
	require.Equal(t, int64(len(holder)), b.countRowsWhere(t, "voucher_claim", "campaign = '"+campaign+"'"))
	return len(holder)
}

func TestClaimCodeConcurrent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		codes, claimers int
		inTx            bool
	}{{100, 100, false}, {100, 300, false}, {100, 100, true}, {100, 300, true}, {20, 30, true}} {
		codes := tc.codes
		name := fmt.Sprintf("%d codes %d claimers", tc.codes, tc.claimers)
		if tc.inTx {
			name += " in transactions"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 16)
			list := codeList("code", codes)
			_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "drop", list)
			require.NoError(t, err)
			client := b.waitClient(t, 30*time.Second)
			claim := func(_ int, member string) (voucher.ClaimResult, error) {
				return voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "drop", Member: member})
			}
			committing := tc.claimers
			if tc.inTx {
				// Each claimer holds its code locked a while, as an
				// application doing its own work in the same transaction
				// would, and every third one then rolls back. Late claimers
				// find every remaining code locked; that must not read as
				// sold out, since a rollback may free one.
				committing = tc.claimers - (tc.claimers+2)/3
				claim = func(i int, member string) (voucher.ClaimResult, error) {
					// READ COMMITTED whatever the server's default: the
					// callers' transactions must commit or roll back as
					// the test decides, not fail with 40001.
					tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
					if err != nil {
						return voucher.ClaimResult{}, err
					}
					defer func() { _ = tx.Rollback(b.ctx) }()
					c, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "drop", Member: member})
					if err != nil {
						return voucher.ClaimResult{}, err
					}
					time.Sleep(20 * time.Millisecond)
					if i%3 == 0 {
						// Rolled back: the member holds nothing.
						return voucher.ClaimResult{Campaign: c.Campaign, Member: member, Total: c.Total}, tx.Rollback(b.ctx)
					}
					return c, tx.Commit(b.ctx)
				}
			}

			got := claimCodes(t, b, claim, "drop", list, tc.claimers)
			require.Equal(t, min(codes, committing), got, "every code is handed out, none sold out while codes are left")
			if committing < codes {
				return
			}
			st, err := voucherOf(t, b.client).Campaign(b.ctx, "drop")
			require.NoError(t, err)
			require.Equal(t, int64(codes), st.Claimed)
			require.True(t, st.SoldOut)
		})
	}
}

func TestClaimCodeRepeat(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "c", codeList("x", 20))
	require.NoError(t, err)

	first, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "c", Member: "alice"})
	require.NoError(t, err)
	require.True(t, first.Claimed)
	require.False(t, first.Repeat)
	again, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "c", Member: "alice"})
	require.NoError(t, err)
	require.True(t, again.Claimed)
	require.True(t, again.Repeat)
	require.Equal(t, first.Code, again.Code)
	require.True(t, first.ClaimedAt.Equal(again.ClaimedAt))

	// A member's concurrent duplicates: one code, the rest repeat it, and
	// the codes the losers picked go back unclaimed.
	const dups = 16
	results := make([]voucher.ClaimResult, dups)
	errs := make([]error, dups)
	client := b.waitClient(t, 30*time.Second)
	concurrently(dups, func(i int) {
		results[i], errs[i] = voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "c", Member: "bob"})
	})
	firsts := 0
	for i, r := range results {
		require.NoError(t, errs[i])
		require.True(t, r.Claimed)
		require.Equal(t, results[0].Code, r.Code)
		if !r.Repeat {
			firsts++
		}
	}
	require.Equal(t, 1, firsts)
	require.Equal(t, int64(1), b.countRowsWhere(t, "voucher_code", "member = 'bob'"))
	require.Equal(t, int64(18), b.countRowsWhere(t, "voucher_code", "member IS NULL"))
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "c")
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Claimed)
	require.Equal(t, int64(18), st.Remaining)
}

// A code locked by a claim that has not committed is not "none left": a
// claimer that finds only locked codes waits, and is told sold out only
// once the holder commits, or gets the code when the holder rolls back.
func TestClaimCodeWaitsForLockedCode(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		name := "holder rolls back"
		if commit {
			name = "holder commits"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 8)
			client := b.waitClient(t, 30*time.Second)
			_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "last", []string{"A", "B"})
			require.NoError(t, err)

			// READ COMMITTED whatever the server's default: the test is
			// about waiting for a row lock, and a SERIALIZABLE holder could
			// fail at commit (40001) instead of committing.
			tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(b.ctx) })
			held, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "last", Member: "holder"})
			require.NoError(t, err)
			require.True(t, held.Claimed)

			// The other code is free: a second member gets it at once
			// (SKIP LOCKED), without waiting for the holder.
			other, err := voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "last", Member: "second"})
			require.NoError(t, err)
			require.True(t, other.Claimed)
			require.NotEqual(t, held.Code, other.Code)

			// The last code is locked: a third member must wait.
			type outcome struct {
				claim voucher.ClaimResult
				err   error
			}
			done := make(chan outcome, 1)
			go func() {
				c, err := voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "last", Member: "third"})
				done <- outcome{c, err}
			}()
			select {
			case o := <-done:
				t.Fatalf("the claim returned while the last code was locked by an open transaction: %+v, %v", o.claim, o.err)
			case <-time.After(500 * time.Millisecond):
			}

			if commit {
				require.NoError(t, tx.Commit(b.ctx))
			} else {
				require.NoError(t, tx.Rollback(b.ctx))
			}
			var o outcome
			select {
			case o = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the waiting claim did not finish after the holder's transaction ended")
			}
			require.NoError(t, o.err)
			if commit {
				require.False(t, o.claim.Claimed, "sold out once the holder committed")
				require.Empty(t, o.claim.Code)
				require.Equal(t, int64(1), b.countRowsWhere(t, "voucher_code", "member = 'holder'"))
			} else {
				require.True(t, o.claim.Claimed, "the rolled-back code goes to the waiting member")
				require.Equal(t, held.Code, o.claim.Code)
				require.Zero(t, b.countRowsWhere(t, "voucher_code", "member = 'holder'"))
			}
			require.Zero(t, b.countRowsWhere(t, "voucher_code", "member IS NULL"))
			require.Equal(t, int64(2), b.CountRows(t, "voucher_claim"))
		})
	}
}

// Every code is locked by a claim that will roll back; claimers that arrive
// meanwhile wait, and each of them gets one of the freed codes.
func TestClaimCodeWaitsForRollbacks(t *testing.T) {
	t.Parallel()
	const codes = 6
	b := setup(t, 2*codes+2)
	client := b.waitClient(t, 30*time.Second)
	_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "c", codeList("c", codes))
	require.NoError(t, err)

	holders := make([]pgx.Tx, codes)
	for i := range holders {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(b.ctx) })
		c, err := voucherOf(t, client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "c", Member: fmt.Sprintf("holder-%d", i)})
		require.NoError(t, err)
		require.True(t, c.Claimed)
		holders[i] = tx
	}

	results := make([]voucher.ClaimResult, codes)
	errs := make([]error, codes)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = voucherOf(t, client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "c", Member: fmt.Sprintf("member-%d", i)})
		}()
	}
	time.Sleep(300 * time.Millisecond)
	for _, tx := range holders {
		require.NoError(t, tx.Rollback(b.ctx))
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, r := range results {
		require.NoError(t, errs[i])
		require.True(t, r.Claimed, "member-%d was told sold out while locked codes could still come free", i)
		require.False(t, seen[r.Code])
		seen[r.Code] = true
	}
	require.Zero(t, b.countRowsWhere(t, "voucher_code", "member IS NULL"))
}

// With every remaining code locked for longer than Config.CodeClaimWait,
// Claim gives up with ErrCodesBusy, not a false "sold out".
func TestClaimCodeBusy(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "one", []string{"only"})
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = voucherOf(t, b.client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "one", Member: "holder"})
	require.NoError(t, err)

	impatient, err := quota.New(b.pool, nil)
	voucherWith(t, impatient, &voucher.Config{CodeClaimWait: 200 * time.Millisecond})
	require.NoError(t, err)
	_, err = voucherOf(t, impatient).Claim(b.ctx, voucher.ClaimRequest{Campaign: "one", Member: "other"})
	require.ErrorIs(t, err, voucher.ErrCodesBusy)
	require.Zero(t, b.countRowsWhere(t, "voucher_claim", "member = 'other'"))
}

func TestVoucherStatusBothKinds(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 3)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", codeList("z", 4))
	require.NoError(t, err)

	want := func(kind voucher.CampaignKind, total, claimed int64) voucher.Campaign {
		return voucher.Campaign{Kind: kind, Total: total, Claimed: claimed, Remaining: total - claimed, SoldOut: claimed == total}
	}
	check := func(campaign string, w voucher.Campaign) {
		t.Helper()
		st, err := voucherOf(t, b.client).Campaign(b.ctx, campaign)
		require.NoError(t, err)
		require.False(t, st.CreatedAt.IsZero())
		w.Name, w.CreatedAt = campaign, st.CreatedAt
		require.Equal(t, w, st)
	}
	check("counted", want(voucher.KindCounted, 3, 0))
	check("codes", want(voucher.KindCodes, 4, 0))
	for i := range 5 {
		_, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "counted", Member: fmt.Sprintf("m%d", i)})
		require.NoError(t, err)
		_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "codes", Member: fmt.Sprintf("m%d", i)})
		require.NoError(t, err)
		check("counted", want(voucher.KindCounted, 3, min(int64(i+1), 3)))
		check("codes", want(voucher.KindCodes, 4, min(int64(i+1), 4)))
	}
	// Repeats change nothing.
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "counted", Member: "m0"})
	require.NoError(t, err)
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "codes", Member: "m0"})
	require.NoError(t, err)
	check("counted", want(voucher.KindCounted, 3, 3))
	check("codes", want(voucher.KindCodes, 4, 4))
}

// Claims on different campaigns never block each other; a smoke test that
// the per-campaign locks are per campaign.
func TestVoucherCampaignsIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "a", 1)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "b", 1)
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = voucherOf(t, b.client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "a", Member: "m"})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	c, err := voucherOf(t, b.client).Claim(ctx, voucher.ClaimRequest{Campaign: "b", Member: "m"})
	require.NoError(t, err, "a claim on another campaign must not wait for this one's lock")
	require.True(t, c.Claimed)
}

// Imports racing on one campaign (created by whichever comes first) count
// every code once: the imported counts add up to the distinct codes, and
// the campaign's total is that number.
func TestImportCodesConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	const importers = 8
	// Importer i loads codes 10*i .. 10*i+39: each code is in up to four
	// imports.
	lists := make([][]string, importers)
	distinct := map[string]bool{}
	for i := range lists {
		for j := 10 * i; j < 10*i+40; j++ {
			code := fmt.Sprintf("k%03d", j)
			lists[i] = append(lists[i], code)
			distinct[code] = true
		}
	}
	results := make([]voucher.ImportResult, importers)
	errs := make([]error, importers)
	concurrently(importers, func(i int) { results[i], errs[i] = voucherOf(t, b.operator).ImportCodes(b.ctx, "race", lists[i]) })
	var imported int64
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, int64(len(lists[i])), r.Imported+r.Duplicates)
		imported += r.Imported
	}
	require.Equal(t, int64(len(distinct)), imported)
	require.Equal(t, int64(len(distinct)), b.CountRows(t, "voucher_code"))
	st, err := voucherOf(t, b.client).Campaign(b.ctx, "race")
	require.NoError(t, err)
	require.Equal(t, int64(len(distinct)), st.Total)
}

// Imports of overlapping code lists of very different sizes, at once, on
// one campaign: none fails (they once deadlocked, SQLSTATE 40P01, because
// each inserted its codes in another order) and every code counts once.
func TestImportCodesConcurrentSizes(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	sizes := []int{30, 300, 1500, 4000, 90, 2500}
	for round := range 3 {
		campaign := fmt.Sprintf("round-%d", round)
		results := make([]voucher.ImportResult, len(sizes))
		errs := make([]error, len(sizes))
		distinct := map[string]bool{}
		lists := make([][]string, len(sizes))
		for i, n := range sizes {
			for j := range n {
				code := fmt.Sprintf("k%05d", (j*7919+i*13+round)%5000)
				lists[i] = append(lists[i], code)
				distinct[code] = true
			}
		}
		concurrently(len(sizes), func(i int) { results[i], errs[i] = voucherOf(t, b.operator).ImportCodes(b.ctx, campaign, lists[i]) })
		var imported int64
		for i := range results {
			require.NoError(t, errs[i], "round %d importer %d", round, i)
			imported += results[i].Imported
		}
		require.Equal(t, int64(len(distinct)), imported, "round %d", round)
		st, err := voucherOf(t, b.client).Campaign(b.ctx, campaign)
		require.NoError(t, err)
		require.Equal(t, int64(len(distinct)), st.Total)
	}
}

// Concurrent creates of one pool: with the same total all succeed and one
// pool exists; with different totals exactly one wins.
func TestCreateVoucherPoolConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	const n = 8
	errs := make([]error, n)
	concurrently(n, func(i int) { _, errs[i] = voucherOf(t, b.operator).CreateCampaign(b.ctx, "same", 5) })
	for _, err := range errs {
		require.NoError(t, err)
	}
	concurrently(n, func(i int) { _, errs[i] = voucherOf(t, b.operator).CreateCampaign(b.ctx, "different", int64(i+1)) })
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			require.ErrorIs(t, err, voucher.ErrCampaignExists)
		}
	}
	require.Equal(t, 1, won)
	require.Equal(t, int64(2), b.CountRows(t, "voucher_pool"))
}
