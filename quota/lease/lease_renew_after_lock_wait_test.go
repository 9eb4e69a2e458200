package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// dbRemaining returns how long the lease has left by the database clock
// now (negative once it expired).
func (b *testBundle) dbRemaining(t *testing.T, name string) time.Duration {
	t.Helper()
	var us int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
		SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1e6)::bigint
		FROM pgquota.lease WHERE name = $1`, name).Scan(&us))
	return time.Duration(us) * time.Microsecond
}

// A Renew that waits for the lease row's lock (held by another session
// FOR UPDATE, or by the holder's own fenced write, FOR SHARE) counts the
// new expiry from the database clock after the wait: the lease it reports
// held is held for the TTL from then, and a third party cannot take it. A
// lease that expired during the wait is reported lost, not extended.
func TestLeaseRenewAfterLockWait(t *testing.T) {
	t.Parallel()
	const wait = 1500 * time.Millisecond
	for _, tc := range []struct {
		name string
		// lock holds the lease row until the returned function is called.
		lock func(t *testing.T, b *testBundle, l lease.Lease) (unlock func())
	}{
		{"another session's FOR UPDATE", func(t *testing.T, b *testBundle, l lease.Lease) func() {
			return b.lockLeaseRow(t, l.Name)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4)

			// Held for 10s, renewed for 1s after a 1.5s wait: the expiry
			// must count from after the wait.
			l := b.acquire(t, "job", "a", 10*time.Second)
			unlock := tc.lock(t, b, l)
			done := make(chan struct{})
			var r lease.Lease
			var err error
			go func() {
				defer close(done)
				r, err = b.leases.Renew(b.ctx, lease.Lease{Name: "job", Token: l.Token}, time.Second)
			}()
			b.waitForLockWait(t)
			time.Sleep(wait)
			unlock()
			<-done
			require.NoError(t, err)
			require.True(t, r.Held)
			require.Equal(t, l.Token, r.Token)
			left := b.dbRemaining(t, "job")
			require.Greater(t, left, 500*time.Millisecond,
				"the expiry the renew wrote counts from after its lock wait (the database has %s left; the call reported %s)", left, r.Remaining())
			require.LessOrEqual(t, r.Remaining(), time.Second)
			// ValidUntil counts from when the statement was sent, before
			// the wait: early, never late.
			require.False(t, r.ValidUntil().After(time.Now().Add(left)), "ValidUntil is not after the database's expiry")
			_, err = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "c", TTL: time.Minute})
			require.ErrorIs(t, err, lease.ErrHeld, "a third party cannot take a lease reported held")

			// Held for 1s, renewed after a 1.5s wait: it expired meanwhile,
			// and stays expired.
			l2 := b.acquire(t, "job2", "a", time.Second)
			unlock = tc.lock(t, b, l2)
			done = make(chan struct{})
			go func() {
				defer close(done)
				r, err = b.leases.Renew(b.ctx, lease.Lease{Name: "job2", Token: l2.Token}, time.Minute)
			}()
			b.waitForLockWait(t)
			time.Sleep(wait)
			unlock()
			<-done
			require.ErrorIs(t, err, lease.ErrLost, "a lease that expired during the wait is not renewed (got %+v)", r)
			require.True(t, b.dbExpired(t, "job2"))
			c, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job2", Holder: "c", TTL: time.Minute})
			require.NoError(t, err)
			require.Greater(t, c.Token, l2.Token)
		})
	}
}

// An Acquire that takes an expired lease after waiting for the row's lock
// (a fenced write of the old holder still open) counts the new lease's
// expiry and its DBNow from after the wait: Held and Remaining tell the
// truth, and the lease is held in the database for its TTL from then.
func TestLeaseAcquireAfterLockWait(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	old := b.acquire(t, "job", "a", 200*time.Millisecond)
	tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.fences.WriteRowTx(b.ctx, tx, fence.WriteRowRequest{
		Resource: "job", Key: "k", Value: "v", Token: old.Token, Lease: "job",
	})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the old lease expires; the write's lock stays

	done := make(chan struct{})
	var l lease.Lease
	go func() {
		defer close(done)
		l, err = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "b", TTL: time.Second})
	}()
	b.waitForLockWait(t)
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, tx.Commit(b.ctx))
	<-done
	if errors.Is(err, lease.ErrHeld) {
		t.Fatalf("the old lease had expired: %v", err)
	}
	require.NoError(t, err)
	require.True(t, l.Held)
	require.Greater(t, l.Token, old.Token)
	require.LessOrEqual(t, l.Remaining(), time.Second)
	left := b.dbRemaining(t, "job")
	require.Greater(t, left, 500*time.Millisecond,
		"the acquired lease's expiry counts from after the lock wait (the database has %s left; the call reported %s)", left, l.Remaining())
	_, err = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "c", TTL: time.Minute})
	require.ErrorIs(t, err, lease.ErrHeld)
}

// An Acquire of a free lease that waits behind another acquirer of the same
// name (its transaction holds the name's advisory lock, then rolls back)
// counts the lease it inserts from after the wait.
func TestLeaseAcquireAfterAcquirerRolledBack(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)

	done := make(chan struct{})
	var l lease.Lease
	go func() {
		defer close(done)
		l, err = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "b", TTL: time.Second})
	}()
	b.waitForLockWait(t)
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, tx.Rollback(b.ctx))
	<-done
	require.NoError(t, err)
	require.True(t, l.Held)
	require.Equal(t, time.Second, l.ExpiresAt.Sub(l.RenewedAt))
	left := b.dbRemaining(t, "job")
	require.Greater(t, left, 500*time.Millisecond,
		"the inserted lease's expiry counts from after the wait (the database has %s left; the call reported %s)", left, l.Remaining())
}
