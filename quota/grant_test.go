package quota_test

import (
	"errors"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

func TestGrantSequential(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](3)})

	wantUsed := []int64{1, 2, 3, 3}
	for i, want := range wantUsed {
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
		require.NoError(t, err)
		require.Equal(t, i < 3, res.Granted, "grant %d", i+1)
		require.Equal(t, want, res.Used, "grant %d", i+1)
		require.Equal(t, int64(3), res.Limit)
		require.Equal(t, 3-want, res.Remaining)
		require.True(t, res.WindowEnd.After(res.WindowStart))
	}
	sum, rows := b.usageRows(t, "q", "m")
	require.Equal(t, int64(3), sum)
	require.Equal(t, int64(1), rows)
}

func TestGrantLimitSources(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "withdefault", Window: quota.WindowNone, DefaultLimit: ptr[int64](2)})
	b.define(t, quota.Definition{Name: "nodefault", Window: quota.WindowNone})

	// The call's limit wins over the override and the default.
	_, err := b.operator.SetMemberLimit(b.ctx, "withdefault", "vip", 5)
	require.NoError(t, err)
	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "withdefault", Member: "vip", Amount: 7, Limit: ptr[int64](7)})
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, int64(7), res.Limit)

	// The override wins over the default.
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "withdefault", Member: "vip2", Amount: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Limit)
	_, err = b.operator.SetMemberLimit(b.ctx, "withdefault", "vip2", 5)
	require.NoError(t, err)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "withdefault", Member: "vip2", Amount: 4})
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, int64(5), res.Used)
	require.Equal(t, int64(5), res.Limit)

	// Clearing the override brings the default back: 5 used, limit 2.
	cleared, err := b.operator.ClearMemberLimit(b.ctx, "withdefault", "vip2")
	require.NoError(t, err)
	require.True(t, cleared)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "withdefault", Member: "vip2", Amount: 1})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Equal(t, int64(5), res.Used)
	require.Equal(t, int64(0), res.Remaining)

	// No limit anywhere: an error, nothing written.
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "nodefault", Member: "m", Amount: 1})
	require.ErrorIs(t, err, quota.ErrNoLimit)
	sum, rows := b.usageRows(t, "nodefault", "m")
	require.Zero(t, sum)
	require.Zero(t, rows)

	// An override alone is enough.
	_, err = b.operator.SetMemberLimit(b.ctx, "nodefault", "m", 1)
	require.NoError(t, err)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "nodefault", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.True(t, res.Granted)

	// Undefined quota.
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
	_, err = b.operator.SetMemberLimit(b.ctx, "nope", "m", 1)
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
}

func TestGrantLimitZeroAndAmountAboveLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay})

	// A limit of 0 denies the first grant of a window and writes no row.
	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: ptr[int64](0)})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Zero(t, res.Used)
	require.Zero(t, b.countRows(t, "usage"))

	// An amount above the limit is denied as a whole, first grant or not.
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 6, Limit: ptr[int64](5)})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Zero(t, b.countRows(t, "usage"))
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Limit: ptr[int64](5)})
	require.NoError(t, err)
	require.True(t, res.Granted)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Limit: ptr[int64](5)})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Equal(t, int64(3), res.Used)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2, Limit: ptr[int64](5)})
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, int64(5), res.Used)
	// Limit 0 on an existing counter.
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: ptr[int64](0)})
	require.NoError(t, err)
	require.False(t, res.Granted)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(5), sum)
}

func TestGrantConcurrentLimitOne(t *testing.T) {
	t.Parallel()
	b := setup(t, 20)
	b.define(t, quota.Definition{Name: "voucher", Window: quota.WindowDay})

	results := make([]quota.GrantResult, 20)
	errs := make([]error, 20)
	concurrently(20, func(i int) {
		results[i], errs[i] = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "voucher", Member: "m", Amount: 1, Limit: ptr[int64](1)})
	})
	granted := 0
	for i := range results {
		require.NoError(t, errs[i])
		if results[i].Granted {
			granted++
			require.Equal(t, int64(1), results[i].Used)
		} else {
			// The denial's fresh read sees the winner's unit.
			require.Equal(t, int64(1), results[i].Used, "denied call %d", i)
		}
	}
	require.Equal(t, 1, granted)
	sum, rows := b.usageRows(t, "voucher", "m")
	require.Equal(t, int64(1), sum)
	require.Equal(t, int64(1), rows)
}

func TestGrantConcurrentHotRow(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 256
		perG       = 20
		limit      = 1000
	)
	b := setup(t, 32)
	b.define(t, quota.Definition{Name: "api", Window: quota.WindowHour, DefaultLimit: ptr[int64](limit)})
	// The run takes seconds; a real clock could cross into the next hour
	// window midway and restart the used values at 1.
	b.setClock(t, "2026-06-15 12:30:00+00")

	var mu sync.Mutex
	var used []int64
	var firstErr error
	concurrently(goroutines, func(int) {
		for range perG {
			res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "api", Member: "hot", Amount: 1})
			mu.Lock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if err == nil && res.Granted {
				used = append(used, res.Used)
			}
			if err == nil && !res.Granted && res.Used+1 <= res.Limit {
				firstErr = errors.New("a denial reported room left")
			}
			mu.Unlock()
		}
	})
	require.NoError(t, firstErr)
	require.Len(t, used, limit)
	sort.Slice(used, func(i, j int) bool { return used[i] < used[j] })
	for i, u := range used {
		require.Equal(t, int64(i+1), u, "the used values of granted calls are exactly 1..%d", limit)
	}
	sum, rows := b.usageRows(t, "api", "hot")
	require.Equal(t, int64(limit), sum)
	require.Equal(t, int64(1), rows)
}

func TestGrantConcurrentFirstGrants(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		limit   int64
		amounts func(i int) int64
		// full: the callers ask for more than the limit in units of 1, so
		// exactly the limit must be granted.
		full bool
	}{
		{"amount 1, limit 10", 10, func(int) int64 { return 1 }, true},
		{"amount 1, limit 1", 1, func(int) int64 { return 1 }, true},
		{"amounts 1..7, limit 50", 50, func(i int) int64 { return int64(i%7 + 1) }, false},
		{"limit 0", 0, func(int) int64 { return 1 }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const callers = 64
			b := setup(t, 16)
			b.define(t, quota.Definition{Name: "q", Window: quota.WindowWeek, TimeZone: "Asia/Tokyo", DefaultLimit: ptr(tc.limit)})
			results := make([]quota.GrantResult, callers)
			errs := make([]error, callers)
			concurrently(callers, func(i int) {
				results[i], errs[i] = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "fresh", Amount: tc.amounts(i)})
			})
			var grantedUnits, grantedCalls int64
			for i, r := range results {
				require.NoError(t, errs[i])
				if r.Granted {
					grantedUnits += r.Amount
					grantedCalls++
				} else {
					require.Greater(t, r.Used+r.Amount, r.Limit, "a denial must be consistent with the usage it reports")
				}
			}
			sum, rows := b.usageRows(t, "q", "fresh")
			require.Equal(t, grantedUnits, sum, "counter equals the units reported granted")
			require.LessOrEqual(t, sum, tc.limit)
			if tc.limit == 0 {
				require.Zero(t, grantedCalls)
				require.Zero(t, rows)
				return
			}
			require.Equal(t, int64(1), rows)
			if tc.full {
				require.Equal(t, tc.limit, grantedCalls, "exactly the limit is granted")
			} else {
				// Every denied amount must really not have fit.
				for _, r := range results {
					if !r.Granted {
						require.Greater(t, sum+r.Amount, tc.limit)
					}
				}
			}
		})
	}
}

func TestGrantTxRollsBackWithCaller(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](5)})

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	res, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2})
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.NoError(t, tx.Rollback(b.ctx))
	sum, rows := b.usageRows(t, "q", "m")
	require.Zero(t, sum)
	require.Zero(t, rows)

	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	sum, _ = b.usageRows(t, "q", "m")
	require.Equal(t, int64(2), sum)
}

func TestRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowMonth, DefaultLimit: ptr[int64](10)})

	// Nothing to revoke yet.
	rv, err := b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 3})
	require.NoError(t, err)
	require.Zero(t, rv.Revoked)
	require.Zero(t, rv.Used)

	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 4})
	require.NoError(t, err)
	rv, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 3})
	require.NoError(t, err)
	require.Equal(t, int64(3), rv.Revoked)
	require.Equal(t, int64(1), rv.Used)
	// Never below zero.
	rv, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 5})
	require.NoError(t, err)
	require.Equal(t, int64(1), rv.Revoked)
	require.Zero(t, rv.Used)

	u, err := b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Zero(t, u.Used)
	require.Equal(t, int64(10), u.Remaining)

	_, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "nope", Member: "m", Amount: 1})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
}

// Grants and revokes racing on one counter: every unit reported granted or
// revoked is accounted for, and the counter stays within [0, limit].
func TestGrantRevokeConcurrent(t *testing.T) {
	t.Parallel()
	const limit = 40
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})

	var mu sync.Mutex
	var granted, revoked int64
	var firstErr error
	concurrently(64, func(i int) {
		for j := range 25 {
			var n int64
			var err error
			if (i+j)%3 == 0 {
				var r quota.RevokeResult
				r, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: int64(j%4 + 1)})
				n = -r.Revoked
				if err == nil && (r.Used < 0 || r.Used > limit) {
					err = errors.New("revoke reported a counter out of range")
				}
			} else {
				var r quota.GrantResult
				r, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: int64(j%3 + 1)})
				if r.Granted {
					n = r.Amount
				}
			}
			mu.Lock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if n > 0 {
				granted += n
			} else {
				revoked -= n
			}
			mu.Unlock()
		}
	})
	require.NoError(t, firstErr)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, granted-revoked, sum)
	require.GreaterOrEqual(t, sum, int64(0))
	require.LessOrEqual(t, sum, int64(limit))
	require.Positive(t, revoked, "the test must exercise revokes")
}
