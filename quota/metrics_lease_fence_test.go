package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// A deposed holder's writes are counted as stale, the holder's own as
// written, a write under a released lease as lease lost; the lease calls
// by outcome (acquired, held, renewed, released, lost) match the calls made
// on two replicas.
func TestMetricsFencedWritesAndLeaseOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c1, m1 := b.meteredClient(t, nil)
	c2, m2 := b.meteredClient(t, nil)
	ctx := b.ctx

	old, err := leaseOf(t, c1).Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	_, err = leaseOf(t, c2).Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "b", TTL: time.Minute})
	require.ErrorIs(t, err, lease.ErrHeld)
	_, err = leaseOf(t, c1).Release(ctx, lease.Lease{Name: "job", Token: old.Token})
	require.NoError(t, err)
	cur, err := leaseOf(t, c2).Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "b", TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, cur.Token, old.Token)

	for i := range 3 { // the paused old holder wakes up and writes
		_, err := fenceOf(t, c1).WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "old", Token: old.Token})
		require.ErrorIs(t, err, fence.ErrStaleToken, i)
	}
	for range 2 {
		_, err := fenceOf(t, c2).WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "new", Token: cur.Token, Lease: "job"})
		require.NoError(t, err)
	}
	_, err = leaseOf(t, c1).Renew(ctx, lease.Lease{Name: "job", Token: old.Token}, time.Minute)
	require.ErrorIs(t, err, lease.ErrLost)
	_, err = leaseOf(t, c2).Renew(ctx, lease.Lease{Name: "job", Token: cur.Token}, time.Minute)
	require.NoError(t, err)
	_, err = leaseOf(t, c2).Release(ctx, lease.Lease{Name: "job", Token: cur.Token})
	require.NoError(t, err)
	_, err = fenceOf(t, c2).WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "late", Token: cur.Token, Lease: "job"})
	require.ErrorIs(t, err, lease.ErrLost)

	for outcome, want := range map[string]int64{"written": 2, "stale_token": 3, "lease_lost": 1, "error": 0} {
		require.Equal(t, want, sumOf(t, "pgquota.fence.writes", map[string]string{"pgquota.outcome": outcome}, m1, m2), outcome)
	}
	var rows int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.fenced_row WHERE value = 'new'`).Scan(&rows))
	require.Equal(t, int64(1), rows)
	for _, tc := range []struct {
		op, outcome string
		want        int64
	}{
		{"acquire", "acquired", 2}, {"acquire", "held", 1}, {"renew", "lost", 1}, {"renew", "renewed", 1},
		{"release", "released", 2}, {"release", "lost", 0},
	} {
		got := sumOf(t, "pgquota.lease.requests", map[string]string{"pgquota.operation": tc.op, "pgquota.outcome": tc.outcome}, m1, m2)
		require.Equal(t, tc.want, got, "%+v", tc)
	}
}

// The renewal margin is the time the lease had left by the database clock
// when the renewal landed: with the clock set by hand, exactly 15s of a
// 60s lease renewed 45s after it was taken.
func TestMetricsRenewalMarginByDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c, m := b.meteredClient(t, nil)
	b.setClock(t, "2030-01-01 00:00:00+00")
	l, err := leaseOf(t, c).Acquire(b.ctx, lease.AcquireRequest{Name: "margin", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	b.setClock(t, "2030-01-01 00:00:45+00")
	_, err = leaseOf(t, c).Renew(b.ctx, lease.Lease{Name: "margin", Token: l.Token}, time.Minute)
	require.NoError(t, err)
	b.setClock(t, "2030-01-01 00:01:40+00") // 5s before the renewed expiry
	_, err = leaseOf(t, c).Renew(b.ctx, lease.Lease{Name: "margin", Token: l.Token}, time.Minute)
	require.NoError(t, err)
	b.setClock(t, "2030-01-01 00:03:00+00") // expired: lost, no margin
	_, err = leaseOf(t, c).Renew(b.ctx, lease.Lease{Name: "margin", Token: l.Token}, time.Minute)
	require.ErrorIs(t, err, lease.ErrLost)

	n, sum := histOf(t, "pgquota.lease.renewal.margin", nil, m)
	require.Equal(t, uint64(2), n)
	require.InDelta(t, 20.0, sum, 1e-9) // 15s + 5s
}

// A renewal whose context ends while it waits for the lease row's lock was
// sent without a reply: counted as outcome unknown for renew, and as a
// renew error.
func TestMetricsOutcomeUnknownCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c, m := b.meteredClient(t, nil)
	l, err := leaseOf(t, c).Acquire(b.ctx, lease.AcquireRequest{Name: "locked", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM pgquota.lease WHERE name = 'locked' FOR UPDATE`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	_, err = leaseOf(t, c).Renew(ctx, lease.Lease{Name: "locked", Token: l.Token}, time.Minute)
	require.ErrorIs(t, err, quota.ErrOutcomeUnknown)

	require.Equal(t, int64(1), sumOf(t, "pgquota.outcome_unknown", map[string]string{"pgquota.operation": "renew"}, m))
	require.Equal(t, int64(1), sumOf(t, "pgquota.lease.requests", map[string]string{"pgquota.operation": "renew", "pgquota.outcome": "error"}, m))
	require.Equal(t, int64(0), sumOf(t, "pgquota.outcome_unknown", map[string]string{"pgquota.operation": "acquire"}, m))
}
