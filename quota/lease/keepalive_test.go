package lease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// renewLog records a keeper's renewal outcomes.
type renewLog struct {
	mu     sync.Mutex
	ok     int
	failed []error
}

func (r *renewLog) record(_ lease.Lease, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failed = append(r.failed, err)
	} else {
		r.ok++
	}
}

func (r *renewLog) failedErrs() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.failed...)
}

func (r *renewLog) counts() (ok, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ok, len(r.failed)
}

func TestKeepaliveRenewsPastTTL(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	// A TTL of 1.5s: renewals every 500ms, each attempt bounded by 250ms
	// (KeepaliveOptions' defaults). The guarantee is that the work goes on
	// past the TTL, not that no attempt ever times out: on a loaded machine
	// under -race one attempt can miss its bound, and the keeper retries it
	// inside the window (TestKeepaliveSurvivesTransientFailures injects
	// that case on purpose). So the test asserts the outcome: the work
	// context lives, the database says the lease is not expired, and most
	// renewals succeeded.
	l := b.acquire(t, "k", "h", 1500*time.Millisecond)
	var log renewLog
	k, err := b.leases.Keepalive(b.ctx, l, &lease.KeepaliveOptions{OnRenew: log.record})
	require.NoError(t, err)
	time.Sleep(3500 * time.Millisecond)
	require.NoError(t, k.Context().Err(), "the work goes on past the TTL")
	ok, failed := log.counts()
	require.GreaterOrEqual(t, ok, 3)
	require.Less(t, failed, ok, "renewals failed: %v", log.failedErrs())
	require.Equal(t, l.Token, k.Lease().Token)
	require.True(t, k.Lease().ExpiresAt.After(l.ExpiresAt))
	require.False(t, b.dbExpired(t, "k"))

	require.NoError(t, k.Stop())
	require.ErrorIs(t, context.Cause(k.Context()), lease.ErrKeepaliveStopped)
	require.NoError(t, k.Stop(), "Stop is idempotent")
}

// One failed renewal, injected by the hook or by a killed connection, does
// not end the work.
func TestKeepaliveSurvivesTransientFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	l := b.acquire(t, "k", "h", 600*time.Millisecond)
	var calls atomic.Int64
	injected := errors.New("injected failure")
	opts := &lease.KeepaliveOptions{}
	var log renewLog
	opts.OnRenew = log.record
	lease.SetBeforeRenew(opts, func(context.Context) error {
		if calls.Add(1) == 2 {
			return injected
		}
		return nil
	})
	k, err := b.leases.Keepalive(b.ctx, l, opts)
	require.NoError(t, err)
	defer k.Stop()

	// Kill every connection of the pool twice while the keeper runs.
	other := b.pool.Config().ConnConfig.Database
	for range 2 {
		time.Sleep(350 * time.Millisecond)
		_, err := b.pool.Exec(b.ctx, `
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, other)
		require.NoError(t, err)
	}
	time.Sleep(700 * time.Millisecond)
	require.NoError(t, k.Context().Err(), "transient failures must not end the work")
	ok, failed := log.counts()
	require.GreaterOrEqual(t, failed, 1)
	require.GreaterOrEqual(t, ok, 3)
	require.ErrorIs(t, log.failed[0], injected)
	require.False(t, b.dbExpired(t, "k"))
}

// watchCancel waits for the keeper's context to end and reports whether the
// lease had expired by the database clock at that moment, asking on a
// connection taken beforehand so the answer comes quickly. It also checks
// the cancellation came before the lease's local validity bound.
func watchCancel(t *testing.T, b *testBundle, k *lease.Keeper, within time.Duration) (expiredAtCancel bool, cause error) {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	select {
	case <-k.Context().Done():
	case <-time.After(within):
		t.Fatal("the work context was not cancelled")
	}
	require.True(t, time.Now().Before(k.Lease().ValidUntil()), "cancelled before the lease's local validity bound")
	var expired bool
	require.NoError(t, conn.QueryRow(b.ctx,
		`SELECT expires_at <= clock_timestamp() FROM pgquota.lease WHERE name = $1`, k.Lease().Name).Scan(&expired))
	return expired, context.Cause(k.Context())
}

func TestKeepaliveCancelsBeforeExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	t.Run("renewals keep failing", func(t *testing.T) {
		l := b.acquire(t, "fail", "h", time.Second)
		opts := &lease.KeepaliveOptions{Margin: 400 * time.Millisecond}
		down := errors.New("database unreachable")
		lease.SetBeforeRenew(opts, func(context.Context) error { return down })
		k, err := b.leases.Keepalive(b.ctx, l, opts)
		require.NoError(t, err)
		expired, cause := watchCancel(t, b, k, 3*time.Second)
		require.False(t, expired, "cancelled before the database expiry")
		require.ErrorIs(t, cause, lease.ErrExpiring)
		require.ErrorIs(t, cause, down, "the cause carries the last renewal error")
		require.False(t, time.Now().Before(l.ValidUntil().Add(-opts.Margin-100*time.Millisecond)), "not cancelled early either")
		require.ErrorIs(t, k.Stop(), lease.ErrExpiring)
	})

	t.Run("renewal hangs", func(t *testing.T) {
		l := b.acquire(t, "hang", "h", time.Second)
		unlock := b.lockLeaseRow(t, "hang") // every renewal now waits for this lock
		defer unlock()
		k, err := b.leases.Keepalive(b.ctx, l, &lease.KeepaliveOptions{Margin: 400 * time.Millisecond})
		require.NoError(t, err)
		expired, cause := watchCancel(t, b, k, 3*time.Second)
		require.False(t, expired, "a hanging renewal is bounded by the deadline")
		require.ErrorIs(t, cause, lease.ErrExpiring)
		k.Stop()
	})

	t.Run("lease taken over", func(t *testing.T) {
		l := b.acquire(t, "stolen", "h", time.Second)
		k, err := b.leases.Keepalive(b.ctx, l, nil)
		require.NoError(t, err)
		// An operator ends the lease and another holder takes it.
		_, err = b.owner.Exec(b.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() WHERE name = 'stolen'`)
		require.NoError(t, err)
		b.acquire(t, "stolen", "thief", time.Minute)
		select {
		case <-k.Context().Done():
		case <-time.After(3 * time.Second):
			t.Fatal("not cancelled")
		}
		require.ErrorIs(t, context.Cause(k.Context()), lease.ErrLost)
		require.ErrorIs(t, k.Stop(), lease.ErrLost)
	})

	t.Run("parent context", func(t *testing.T) {
		l := b.acquire(t, "parent", "h", time.Second)
		ctx, cancel := context.WithCancelCause(b.ctx)
		k, err := b.leases.Keepalive(ctx, l, nil)
		require.NoError(t, err)
		done := errors.New("work finished")
		cancel(done)
		<-k.Done()
		require.ErrorIs(t, context.Cause(k.Context()), done)
	})
}

func TestKeepaliveOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	l := b.acquire(t, "k", "h", time.Second)
	for _, o := range []lease.KeepaliveOptions{
		{Margin: time.Second},
		{Margin: -1},
		{Interval: 950 * time.Millisecond},
		{TTL: 30},
		{AttemptTimeout: -time.Millisecond},
		{AttemptTimeout: 900 * time.Millisecond},
	} {
		_, err := b.leases.Keepalive(b.ctx, l, &o)
		require.ErrorIs(t, err, quota.ErrInvalidInput, "%+v", o)
	}
	// A lease this package did not return is renewed first.
	k, err := b.leases.Keepalive(b.ctx, lease.Lease{Name: "k", Token: l.Token}, &lease.KeepaliveOptions{TTL: time.Second})
	require.NoError(t, err)
	require.NoError(t, k.Stop())
	_, err = b.leases.Keepalive(b.ctx, lease.Lease{Name: "k", Token: l.Token + 1}, &lease.KeepaliveOptions{TTL: time.Second})
	require.ErrorIs(t, err, lease.ErrLost)
}
