package fence_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// A Revoke (the documented compensation for a grant) that lands between
// GrantFenced's read and its fenced write is silently undone: the fenced
// write stores read+amount over the revoked counter. Revoke reports the unit
// given back, yet the counter still holds it.
func TestBreakGrantFencedLosesConcurrentRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})

	first, err := grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, 0)
	require.NoError(t, err)
	require.True(t, first.Granted)

	var revoked int64
	setFencedGrantPause(b.client, func(ctx context.Context, _ lease.Lease) {
		setFencedGrantPause(b.client, nil)
		r, err := b.client.Revoke(ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1})
		require.NoError(t, err)
		revoked = r.Revoked
	})
	second, err := grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, 0)
	require.NoError(t, err)
	require.True(t, second.Granted)
	require.Equal(t, int64(1), revoked)

	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, first.Amount+second.Amount-revoked, sum,
		"counter equals units granted minus units revoked")
}

// Grant and GrantFenced on the same counter: a conditional grant that lands
// between GrantFenced's read and its write is overwritten, so more units are
// reported granted than the limit allows, and the counter is below the units
// granted.
func TestBreakGrantFencedOverwritesConcurrentGrant(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](1)})

	var inner quota.GrantResult
	setFencedGrantPause(b.client, func(ctx context.Context, _ lease.Lease) {
		setFencedGrantPause(b.client, nil)
		var err error
		inner, err = b.client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
		require.NoError(t, err)
	})
	outer, err := grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, 5*time.Second)
	require.NoError(t, err)

	var units int64
	for _, r := range []quota.GrantResult{inner, outer} {
		if r.Granted {
			units += r.Amount
		}
	}
	sum, _ := b.usageRows(t, "q", "m")
	require.LessOrEqual(t, units, int64(1), "limit 1: at most one unit granted")
	require.Equal(t, units, sum, "counter equals the units reported granted")
}

// GrantFenced, Grant and Revoke racing on one counter without injected
// pauses: every unit reported granted or revoked is accounted for, and the
// counter stays within [0, limit].
func TestBreakGrantFencedMixedConcurrent(t *testing.T) {
	t.Parallel()
	const limit = 30
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})

	var list errList
	var mu sync.Mutex
	var granted, revoked int64
	concurrently(24, func(i int) {
		for j := range 8 {
			var n int64
			var err error
			switch (i + j) % 3 {
			case 0:
				var r quota.RevokeResult
				r, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1})
				n = -r.Revoked
			case 1:
				var r quota.GrantResult
				r, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2})
				if r.Granted {
					n = r.Amount
				}
			default:
				var r quota.GrantResult
				r, err = grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, 5*time.Second)
				if r.Granted {
					n = r.Amount
				}
			}
			list.Add(err)
			mu.Lock()
			if n > 0 {
				granted += n
			} else {
				revoked -= n
			}
			mu.Unlock()
		}
	})
	list.RequireNone(t, "calls")
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, granted-revoked, sum)
	require.LessOrEqual(t, sum, int64(limit))
}
