package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
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

	old, err := c1.Acquire(ctx, quota.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	_, err = c2.Acquire(ctx, quota.AcquireRequest{Name: "job", Holder: "b", TTL: time.Minute})
	require.ErrorIs(t, err, quota.ErrLeaseHeld)
	_, err = c1.Release(ctx, "job", old.Token)
	require.NoError(t, err)
	cur, err := c2.Acquire(ctx, quota.AcquireRequest{Name: "job", Holder: "b", TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, cur.Token, old.Token)

	for i := range 3 { // the paused old holder wakes up and writes
		_, err := c1.WriteFencedRow(ctx, quota.WriteFencedRowRequest{Resource: "job", Key: "k", Value: "old", Token: old.Token})
		require.ErrorIs(t, err, quota.ErrStaleToken, i)
	}
	for range 2 {
		_, err := c2.WriteFencedRow(ctx, quota.WriteFencedRowRequest{Resource: "job", Key: "k", Value: "new", Token: cur.Token, Lease: "job"})
		require.NoError(t, err)
	}
	_, err = c1.Renew(ctx, "job", old.Token, time.Minute)
	require.ErrorIs(t, err, quota.ErrLeaseLost)
	_, err = c2.Renew(ctx, "job", cur.Token, time.Minute)
	require.NoError(t, err)
	_, err = c2.Release(ctx, "job", cur.Token)
	require.NoError(t, err)
	_, err = c2.WriteFencedRow(ctx, quota.WriteFencedRowRequest{Resource: "job", Key: "k", Value: "late", Token: cur.Token, Lease: "job"})
	require.ErrorIs(t, err, quota.ErrLeaseLost)

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
	l, err := c.Acquire(b.ctx, quota.AcquireRequest{Name: "margin", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	b.setClock(t, "2030-01-01 00:00:45+00")
	_, err = c.Renew(b.ctx, "margin", l.Token, time.Minute)
	require.NoError(t, err)
	b.setClock(t, "2030-01-01 00:01:40+00") // 5s before the renewed expiry
	_, err = c.Renew(b.ctx, "margin", l.Token, time.Minute)
	require.NoError(t, err)
	b.setClock(t, "2030-01-01 00:03:00+00") // expired: lost, no margin
	_, err = c.Renew(b.ctx, "margin", l.Token, time.Minute)
	require.ErrorIs(t, err, quota.ErrLeaseLost)

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
	l, err := c.Acquire(b.ctx, quota.AcquireRequest{Name: "locked", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM pgquota.lease WHERE name = 'locked' FOR UPDATE`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	_, err = c.Renew(ctx, "locked", l.Token, time.Minute)
	require.ErrorIs(t, err, quota.ErrOutcomeUnknown)

	require.Equal(t, int64(1), sumOf(t, "pgquota.outcome_unknown", map[string]string{"pgquota.operation": "renew"}, m))
	require.Equal(t, int64(1), sumOf(t, "pgquota.lease.requests", map[string]string{"pgquota.operation": "renew", "pgquota.outcome": "error"}, m))
	require.Equal(t, int64(0), sumOf(t, "pgquota.outcome_unknown", map[string]string{"pgquota.operation": "acquire"}, m))
}
