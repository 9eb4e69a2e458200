package quota_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

func key(k string) quota.IdempotencyKey { return quota.IdempotencyKey{Key: k} }

func (b *testBundle) ledgerRows(t *testing.T) int64 { t.Helper(); return b.bundle().LedgerRows(t) }

func TestGrantKeyedReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](3)})

	req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 2, Idempotency: key("order-1")}
	first, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, first.Granted)
	require.Positive(t, first.GrantID)
	require.False(t, first.Replayed)
	require.Equal(t, "q", first.IdempotencyScope, "the scope defaults to the quota")
	require.Equal(t, "order-1", first.IdempotencyKey)

	for range 3 {
		again, err := b.client.Grant(b.ctx, req)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		again.Replayed = false
		require.Equal(t, first, again, "a repeat returns the first outcome")
	}
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(2), sum)
	require.Equal(t, int64(1), b.ledgerRows(t))

	// A denial is an outcome too: stored, and replayed even once units are
	// free again.
	denyReq := quota.GrantRequest{Quota: "q", Member: "m", Amount: 2, Idempotency: key("order-2")}
	denied, err := b.client.Grant(b.ctx, denyReq)
	require.NoError(t, err)
	require.False(t, denied.Granted)
	require.Positive(t, denied.GrantID)
	_, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 2})
	require.NoError(t, err)
	again, err := b.client.Grant(b.ctx, denyReq)
	require.NoError(t, err)
	require.False(t, again.Granted)
	require.True(t, again.Replayed)
	require.Equal(t, denied.GrantID, again.GrantID)
	require.Equal(t, denied.Used, again.Used)

	// Grants without a key are not recorded.
	plain, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.Zero(t, plain.GrantID)
	require.Equal(t, int64(2), b.ledgerRows(t))

	// Errors are not stored: the key stays free.
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1, Idempotency: key("k3")})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
	b.define(t, quota.Definition{Name: "nolimit", Window: quota.WindowDay})
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "nolimit", Member: "m", Amount: 1, Idempotency: key("k3")})
	require.ErrorIs(t, err, quota.ErrNoLimit)
	require.Equal(t, int64(2), b.ledgerRows(t))
	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "nolimit", Member: "m", Amount: 1, Limit: ptr[int64](1), Idempotency: key("k3")})
	require.NoError(t, err)
	require.True(t, res.Granted)

	// Scopes are separate namespaces.
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1,
		Idempotency: quota.IdempotencyKey{Key: "order-1", Scope: "checkout"}})
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.NotEqual(t, first.GrantID, res.GrantID)

	// Bad keys are rejected before any write.
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1,
		Idempotency: quota.IdempotencyKey{Key: "k\x00"}})
	var ie *quota.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "idempotency key", ie.Field)
}

func TestGrantKeyReusedWithAnotherRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
	b.define(t, quota.Definition{Name: "q2", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
	shared := quota.IdempotencyKey{Key: "k", Scope: "shared"}

	first, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: shared})
	require.NoError(t, err)
	require.True(t, first.Granted)

	others := []quota.GrantRequest{
		{Quota: "q", Member: "other", Amount: 1, Idempotency: shared},
		{Quota: "q", Member: "m", Amount: 2, Idempotency: shared},
		{Quota: "q2", Member: "m", Amount: 1, Idempotency: shared},
		{Quota: "q", Member: "m", Amount: 1, Limit: ptr[int64](10), Idempotency: shared},
	}
	for _, req := range others {
		_, err := b.client.Grant(b.ctx, req)
		require.ErrorIs(t, err, quota.ErrIdempotencyKeyReused, "%+v", req)
		require.ErrorContains(t, err, fmt.Sprintf("grant %d", first.GrantID))
	}
	// Another operation under the same key.
	_, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: shared})
	require.ErrorIs(t, err, quota.ErrIdempotencyKeyReused)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "camp", 5)
	require.NoError(t, err)
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "camp", Member: "m", Idempotency: shared})
	require.ErrorIs(t, err, quota.ErrIdempotencyKeyReused)

	// Nothing was written by any of them.
	require.Equal(t, int64(1), b.ledgerRows(t))
	sum, rows := b.usageRows(t, "q", "m")
	require.Equal(t, int64(1), sum)
	require.Equal(t, int64(1), rows)
	for _, m := range []string{"other"} {
		_, rows := b.usageRows(t, "q", m)
		require.Zero(t, rows)
	}
	_, rows = b.usageRows(t, "q2", "m")
	require.Zero(t, rows)
	require.Zero(t, b.countRows(t, "voucher_claim"))
}

// 50 concurrent copies of one keyed grant: one unit granted, every copy
// sees the same outcome and grant id.
func TestGrantKeyedConcurrentCopies(t *testing.T) {
	t.Parallel()
	const copies = 50
	for _, tc := range []struct {
		name  string
		limit int64
		prior int64 // units granted (without a key) before the copies race
	}{
		{"first grant of the window", 5, 0},
		{"existing counter", 5, 2},
		{"denied", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 16)
			b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(tc.limit)})
			if tc.prior > 0 {
				_, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: tc.prior})
				require.NoError(t, err)
			}
			results := make([]quota.GrantResult, copies)
			errs := make([]error, copies)
			concurrently(copies, func(i int) {
				results[i], errs[i] = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("once")})
			})
			replayed := 0
			for i := range results {
				require.NoError(t, errs[i])
				if results[i].Replayed {
					replayed++
				}
				r := results[i]
				r.Replayed = false
				first := results[0]
				first.Replayed = false
				require.Equal(t, first, r, "copy %d sees the first outcome", i)
			}
			require.Equal(t, copies-1, replayed, "exactly one copy made the grant")
			wantGranted := tc.prior+1 <= tc.limit
			require.Equal(t, wantGranted, results[0].Granted)
			sum, rows := b.usageRows(t, "q", "m")
			want := tc.prior
			if wantGranted {
				want++
			}
			require.Equal(t, want, sum)
			require.LessOrEqual(t, rows, int64(1))
			require.Equal(t, int64(1), b.ledgerRows(t))
		})
	}
}

// Many keys, each sent by several racing copies, against one limited
// counter: the limit holds, and the counter equals the number of keys
// granted.
func TestGrantKeyedConcurrentManyKeys(t *testing.T) {
	t.Parallel()
	const (
		keys   = 40
		copies = 4
		limit  = 25
	)
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})
	results := make([]quota.GrantResult, keys*copies)
	errs := make([]error, keys*copies)
	concurrently(keys*copies, func(i int) {
		results[i], errs[i] = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key(fmt.Sprint("k", i%keys))})
	})
	byKey := map[string]quota.GrantResult{}
	var granted int64
	for i, r := range results {
		require.NoError(t, errs[i])
		if prev, ok := byKey[r.IdempotencyKey]; ok {
			require.Equal(t, prev.GrantID, r.GrantID)
			require.Equal(t, prev.Granted, r.Granted)
			continue
		}
		byKey[r.IdempotencyKey] = r
		if r.Granted {
			granted++
		}
	}
	require.Len(t, byKey, keys)
	require.Equal(t, int64(limit), granted)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(limit), sum)
	require.Equal(t, int64(keys), b.ledgerRows(t))
}

func TestGrantTxKeyedRollsBackWithCaller(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](5)})
	req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("k")}

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	res, err := b.client.GrantTx(b.ctx, tx, req)
	require.NoError(t, err)
	require.True(t, res.Granted)
	// The same key again in the same transaction replays.
	again, err := b.client.GrantTx(b.ctx, tx, req)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, res.GrantID, again.GrantID)

	// A concurrent copy waits for tx; once tx rolls back, it grants itself.
	done := make(chan quota.GrantResult)
	go func() {
		r, err := b.client.Grant(b.ctx, req)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	b.waitForLockWait(t)
	require.NoError(t, tx.Rollback(b.ctx))
	r := <-done
	require.True(t, r.Granted)
	require.False(t, r.Replayed)
	require.NotEqual(t, res.GrantID, r.GrantID)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(1), sum)
	require.Equal(t, int64(1), b.ledgerRows(t))
}

// waitForLockWait waits until some session of the test's database waits
// for a lock.
func (b *testBundle) waitForLockWait(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(b.ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

func TestRevokeKeyed(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
	_, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 6})
	require.NoError(t, err)

	results := make([]quota.RevokeResult, 20)
	errs := make([]error, 20)
	concurrently(20, func(i int) {
		results[i], errs[i] = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 4, Idempotency: key("refund-1")})
	})
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, int64(4), r.Revoked)
		require.Equal(t, int64(2), r.Used)
		require.Equal(t, results[0].GrantID, r.GrantID)
	}
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(2), sum)

	// Never below zero, and the partial outcome is what is replayed.
	r, err := b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 5, Idempotency: key("refund-2")})
	require.NoError(t, err)
	require.Equal(t, int64(2), r.Revoked)
	require.Zero(t, r.Used)
	r, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 5, Idempotency: key("refund-2")})
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.Equal(t, int64(2), r.Revoked)

	_, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("refund-2")})
	require.ErrorIs(t, err, quota.ErrIdempotencyKeyReused)
}

func TestRevokeGrant(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})

	g, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Idempotency: key("g1")})
	require.NoError(t, err)
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 4})
	require.NoError(t, err)

	rv, err := b.client.CompensateGrant(b.ctx, g.GrantID)
	require.NoError(t, err)
	require.False(t, rv.Replayed)
	require.True(t, rv.Granted)
	require.Equal(t, int64(3), rv.Amount)
	require.Equal(t, int64(3), rv.Revoked)
	require.Equal(t, int64(4), rv.Used)
	require.Equal(t, g.WindowStart, rv.WindowStart)
	require.False(t, rv.RevokedAt.IsZero())

	again, err := b.client.CompensateGrant(b.ctx, g.GrantID)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	again.Replayed = false
	require.Equal(t, rv, again)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(4), sum)

	e, err := b.client.LedgerEntry(b.ctx, g.GrantID)
	require.NoError(t, err)
	require.Equal(t, quota.OpGrant, e.Operation)
	require.NotNil(t, e.Compensation)
	require.Equal(t, int64(3), e.Compensation.Revoked)
	byKey, err := b.client.LedgerEntryByKey(b.ctx, quota.IdempotencyKey{Scope: "q", Key: "g1"})
	require.NoError(t, err)
	require.Equal(t, e, byKey)

	// Never below zero, never more than granted: the counter holds 1 when
	// the grant of 3 is revoked.
	g2, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m2", Amount: 3, Idempotency: key("g2")})
	require.NoError(t, err)
	_, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m2", Amount: 2})
	require.NoError(t, err)
	rv, err = b.client.CompensateGrant(b.ctx, g2.GrantID)
	require.NoError(t, err)
	require.Equal(t, int64(1), rv.Revoked)
	require.Zero(t, rv.Used)
	sum, _ = b.usageRows(t, "q", "m2")
	require.Zero(t, sum)

	// A denied grant has nothing to give back.
	d, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 50, Idempotency: key("big")})
	require.NoError(t, err)
	require.False(t, d.Granted)
	rv, err = b.client.CompensateGrant(b.ctx, d.GrantID)
	require.NoError(t, err)
	require.False(t, rv.Granted)
	require.Zero(t, rv.Revoked)
	sum, _ = b.usageRows(t, "q", "m")
	require.Equal(t, int64(4), sum)

	// Unknown ids, and ids of entries that are not grants.
	_, err = b.client.CompensateGrant(b.ctx, 999999)
	require.ErrorIs(t, err, quota.ErrGrantNotFound)
	rk, err := b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("r")})
	require.NoError(t, err)
	_, err = b.client.CompensateGrant(b.ctx, rk.GrantID)
	require.ErrorIs(t, err, quota.ErrGrantNotFound)
	_, err = b.client.CompensateGrant(b.ctx, 0)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
}

// The units of a grant go back to its own window's counter, even after the
// window has ended.
func TestRevokeGrantOwnWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})

	b.setClock(t, "2030-01-01 12:00:00+00")
	g, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Idempotency: key("day1")})
	require.NoError(t, err)
	b.setClock(t, "2030-01-02 12:00:00+00")
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 5})
	require.NoError(t, err)

	rv, err := b.client.CompensateGrant(b.ctx, g.GrantID)
	require.NoError(t, err)
	require.Equal(t, int64(3), rv.Revoked)
	require.Zero(t, rv.Used)
	require.Equal(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), rv.WindowStart.UTC())

	var day1, day2 int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
		SELECT coalesce(sum(used) FILTER (WHERE window_start = '2030-01-01 00:00:00+00'), -1),
		       coalesce(sum(used) FILTER (WHERE window_start = '2030-01-02 00:00:00+00'), -1)
		FROM pgquota.usage`).Scan(&day1, &day2))
	require.Zero(t, day1)
	require.Equal(t, int64(5), day2, "the current window is untouched")
}

// 20 concurrent revokes of one grant give its units back once.
func TestRevokeGrantConcurrent(t *testing.T) {
	t.Parallel()
	const revokers = 20
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](100)})
	g, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 7, Idempotency: key("g")})
	require.NoError(t, err)
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 10})
	require.NoError(t, err)

	results := make([]quota.CompensateGrantResult, revokers)
	errs := make([]error, revokers)
	concurrently(revokers, func(i int) {
		if i%2 == 0 {
			results[i], errs[i] = b.client.CompensateGrant(b.ctx, g.GrantID)
			return
		}
		// Half of them in a caller's transaction.
		errs[i] = quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			var err error
			results[i], err = b.client.CompensateGrantTx(b.ctx, tx, g.GrantID)
			return err
		})
	})
	first := 0
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, int64(7), r.Revoked)
		require.Equal(t, int64(10), r.Used)
		if !r.Replayed {
			first++
		}
	}
	require.Equal(t, 1, first, "exactly one revoke gave the units back")
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(10), sum)
}

func TestClaimVoucherWithKey(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "camp", 2)
	require.NoError(t, err)

	// 30 copies of one keyed claim race.
	results := make([]voucher.ClaimResult, 30)
	errs := make([]error, 30)
	concurrently(30, func(i int) {
		results[i], errs[i] = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "camp", Member: "alice", Idempotency: key("click-1")})
	})
	replayed := 0
	for i, r := range results {
		require.NoError(t, errs[i])
		require.True(t, r.Claimed)
		require.Equal(t, int64(1), r.Seq)
		require.Equal(t, results[0].GrantID, r.GrantID)
		if r.Replayed {
			replayed++
		}
	}
	require.Equal(t, 29, replayed)

	// Another key for the same member: the member's first claim comes back
	// as a repeat, recorded under the new key.
	r, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "camp", Member: "alice", Idempotency: key("click-2")})
	require.NoError(t, err)
	require.True(t, r.Claimed)
	require.True(t, r.Repeat)
	require.False(t, r.Replayed)
	require.Equal(t, int64(1), r.Seq)

	// Sold out is an outcome, replayed after units... never come back, but
	// the key keeps its first answer.
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "camp", Member: "bob", Idempotency: key("b")})
	require.NoError(t, err)
	r, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "camp", Member: "carol", Idempotency: key("c")})
	require.NoError(t, err)
	require.False(t, r.Claimed)
	r, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "camp", Member: "carol", Idempotency: key("c")})
	require.NoError(t, err)
	require.False(t, r.Claimed)
	require.True(t, r.Replayed)

	p, err := voucherOf(t, b.client).Campaign(b.ctx, "camp")
	require.NoError(t, err)
	require.Equal(t, int64(2), p.Claimed)
	require.Equal(t, int64(4), b.ledgerRows(t))

	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "nope", Member: "m", Idempotency: key("x")})
	require.ErrorIs(t, err, voucher.ErrCampaignNotFound)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{"A"})
	require.NoError(t, err)
	require.Equal(t, int64(4), b.ledgerRows(t), "errors write nothing")
}

func TestClaimCodeWithKey(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "spring", []string{"A", "B", "C"})
	require.NoError(t, err)

	// Two members, each sending 10 copies of their keyed claim.
	results := make([]voucher.ClaimResult, 20)
	errs := make([]error, 20)
	concurrently(20, func(i int) {
		member := fmt.Sprint("m", i%2)
		results[i], errs[i] = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "spring", Member: member, Idempotency: key("k-" + member)})
	})
	codes := map[string]string{}
	for i, r := range results {
		require.NoError(t, errs[i])
		require.True(t, r.Claimed)
		if prev, ok := codes[r.Member]; ok {
			require.Equal(t, prev, r.Code)
		}
		codes[r.Member] = r.Code
	}
	require.NotEqual(t, codes["m0"], codes["m1"])
	require.Equal(t, int64(2), b.ledgerRows(t))

	r, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "spring", Member: "m2", Idempotency: key("k-m2")})
	require.NoError(t, err)
	require.True(t, r.Claimed)
	r, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "spring", Member: "m3", Idempotency: key("k-m3")})
	require.NoError(t, err)
	require.False(t, r.Claimed, "sold out")
	r, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "spring", Member: "m3", Idempotency: key("k-m3")})
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.False(t, r.Claimed)
	p, err := voucherOf(t, b.client).Campaign(b.ctx, "spring")
	require.NoError(t, err)
	require.Equal(t, int64(3), p.Claimed)
}

func TestReapLedger(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})

	b.setClock(t, "2030-01-01 00:00:00+00")
	old, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("old")})
	require.NoError(t, err)
	b.setClock(t, "2030-01-20 00:00:00+00")
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("new")})
	require.NoError(t, err)

	b.setClock(t, "2030-02-01 00:00:00+00")
	n, err := b.operator.ReapLedger(b.ctx, 720*time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, int64(1), b.ledgerRows(t))
	_, err = b.client.LedgerEntry(b.ctx, old.GrantID)
	require.ErrorIs(t, err, quota.ErrGrantNotFound)

	// A reaped key is free again: the repeat is a new grant.
	again, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("old")})
	require.NoError(t, err)
	require.False(t, again.Replayed)
	require.NotEqual(t, old.GrantID, again.GrantID)

	_, err = b.operator.ReapLedger(b.ctx, 0)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
}

// Keyed grants in a caller's SERIALIZABLE transactions, retried by RunInTx:
// every key granted once.
func TestGrantTxKeyedSerializableRunInTx(t *testing.T) {
	t.Parallel()
	const callers = 24
	b := setup(t, 12)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
	results := make([]quota.GrantResult, callers)
	errs := make([]error, callers)
	concurrently(callers, func(i int) {
		errs[i] = quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
			var err error
			results[i], err = b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key(fmt.Sprint("k", i%12))})
			return err
		})
	})
	grants := map[int64]bool{}
	for i, r := range results {
		require.NoError(t, errs[i])
		grants[r.GrantID] = r.Granted
	}
	require.Len(t, grants, 12)
	var granted int64
	for _, g := range grants {
		if g {
			granted++
		}
	}
	require.Equal(t, int64(10), granted)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(10), sum)
}
