package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// acquire acquires a lease or fails the test.
func TestLeaseAcquireRenewRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	l1 := b.acquire(t, "job", "worker-1", time.Minute)
	require.Equal(t, "job", l1.Name)
	require.Equal(t, "worker-1", l1.Holder)
	require.Positive(t, l1.Token)
	require.True(t, l1.Held)
	require.Equal(t, time.Minute, l1.ExpiresAt.Sub(l1.AcquiredAt), "the TTL counts from the database clock")
	require.InDelta(t, time.Minute, l1.Remaining(), float64(time.Second))
	require.WithinDuration(t, time.Now().Add(time.Minute), l1.ValidUntil(), 5*time.Second)

	// Held: another holder gets ErrLeaseHeld naming the holder and the expiry.
	_, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "worker-2", TTL: time.Minute})
	require.ErrorIs(t, err, lease.ErrHeld)
	var held *lease.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, "worker-1", held.Holder)
	require.True(t, held.ExpiresAt.Equal(l1.ExpiresAt))
	require.Positive(t, held.Remaining)

	// Renewal keeps the token and moves the expiry.
	r, err := b.leases.Renew(b.ctx, lease.Lease{Name: "job", Token: l1.Token}, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, l1.Token, r.Token)
	require.True(t, r.ExpiresAt.After(l1.ExpiresAt))
	require.Equal(t, 2*time.Minute, r.ExpiresAt.Sub(r.RenewedAt))

	got, err := b.leases.Get(b.ctx, "job")
	require.NoError(t, err)
	require.Equal(t, l1.Token, got.Token)
	require.True(t, got.Held)

	// Release, twice (safe to retry); then the lease is free.
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "job", Token: l1.Token})
	require.NoError(t, err)
	rel, err := b.leases.Release(b.ctx, lease.Lease{Name: "job", Token: l1.Token})
	require.NoError(t, err)
	require.False(t, rel.Held)
	_, err = b.leases.Renew(b.ctx, lease.Lease{Name: "job", Token: l1.Token}, time.Minute)
	require.ErrorIs(t, err, lease.ErrLost, "a released lease cannot be renewed")

	l2 := b.acquire(t, "job", "worker-2", time.Minute)
	require.Greater(t, l2.Token, l1.Token)

	// The deposed holder can neither release nor renew its successor's lease.
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "job", Token: l1.Token})
	require.ErrorIs(t, err, lease.ErrLost)
	require.ErrorContains(t, err, "worker-2")
	_, err = b.leases.Renew(b.ctx, lease.Lease{Name: "job", Token: l1.Token}, time.Minute)
	require.ErrorIs(t, err, lease.ErrLost)
	got, err = b.leases.Get(b.ctx, "job")
	require.NoError(t, err)
	require.Equal(t, l2.Token, got.Token)
	require.True(t, got.Held)

	_, err = b.leases.Get(b.ctx, "nope")
	require.ErrorIs(t, err, lease.ErrNotFound)
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "nope", Token: 1})
	require.ErrorIs(t, err, lease.ErrLost)
}

func TestLeaseInputValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	cases := []struct {
		name  string
		req   lease.AcquireRequest
		field string
	}{
		{"zero ttl", lease.AcquireRequest{Name: "n", Holder: "h"}, "ttl"},
		{"negative ttl", lease.AcquireRequest{Name: "n", Holder: "h", TTL: -time.Second}, "ttl"},
		{"unit mistake", lease.AcquireRequest{Name: "n", Holder: "h", TTL: 30}, "ttl"},
		{"ttl too long", lease.AcquireRequest{Name: "n", Holder: "h", TTL: 25 * time.Hour}, "ttl"},
		{"no name", lease.AcquireRequest{Holder: "h", TTL: time.Second}, "lease name"},
		{"control character in holder", lease.AcquireRequest{Name: "n", Holder: "h\x00", TTL: time.Second}, "holder"},
		{"control character", lease.AcquireRequest{Name: "n\x00", Holder: "h", TTL: time.Second}, "lease name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.leases.Acquire(b.ctx, tc.req)
			require.ErrorIs(t, err, quota.ErrInvalidInput)
			var ie *quota.InputError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.field, ie.Field)
		})
	}
	_, err := b.leases.Renew(b.ctx, lease.Lease{Name: "n", Token: 0}, time.Second)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	_, err = b.leases.Renew(b.ctx, lease.Lease{Name: "n", Token: 1}, 0)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.Zero(t, b.countRows(t, "lease"))
}

// A retry of the same attempt after a lost reply returns the same lease; a
// new attempt with the same holder name is a different acquisition.
func TestLeaseAttemptIdentity(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	req := lease.AcquireRequest{Name: "res", Holder: "pod-a", TTL: time.Minute, Attempt: lease.NewAttempt()}
	first, err := b.leases.Acquire(b.ctx, req)
	require.NoError(t, err)
	// The reply is "lost"; the caller retries the same attempt.
	retry, err := b.leases.Acquire(b.ctx, req)
	require.NoError(t, err)
	require.Equal(t, first.Token, retry.Token)
	require.True(t, first.ExpiresAt.Equal(retry.ExpiresAt), "a retry does not extend the lease")

	// Same holder name, new attempt: held.
	_, err = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "res", Holder: "pod-a", TTL: time.Minute})
	require.ErrorIs(t, err, lease.ErrHeld)

	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "res", Token: first.Token})
	require.NoError(t, err)
	next, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "res", Holder: "pod-a", TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, next.Token, first.Token)
	// The old attempt, retried late, does not get the lease back.
	_, err = b.leases.Acquire(b.ctx, req)
	require.ErrorIs(t, err, lease.ErrHeld)
}

func TestLeaseConcurrentAcquirers(t *testing.T) {
	t.Parallel()
	const acquirers = 64
	b := setup(t, 16)
	leases := make([]lease.Lease, acquirers)
	errs := make([]error, acquirers)
	concurrently(acquirers, func(i int) {
		leases[i], errs[i] = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "free", Holder: "h", TTL: time.Minute})
	})
	winners := 0
	var winner lease.Lease
	for i, err := range errs {
		if err == nil {
			winners++
			winner = leases[i]
			continue
		}
		require.ErrorIs(t, err, lease.ErrHeld)
	}
	require.Equal(t, 1, winners)
	got, err := b.leases.Get(b.ctx, "free")
	require.NoError(t, err)
	require.Equal(t, winner.Token, got.Token)
	require.Equal(t, winner.Attempt, got.Attempt)
}

func TestLeaseTokensStrictlyIncrease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	var last int64
	for i := range 1000 {
		l := b.acquire(t, "cycle", "h", time.Minute)
		require.Greater(t, l.Token, last, "cycle %d", i)
		last = l.Token
		_, err := b.leases.Release(b.ctx, lease.Lease{Name: "cycle", Token: l.Token})
		require.NoError(t, err)
	}
	// A deleted lease row does not reset the token.
	_, err := b.owner.Exec(b.ctx, `DELETE FROM pgquota.lease`)
	require.NoError(t, err)
	l := b.acquire(t, "cycle", "h", time.Minute)
	require.Greater(t, l.Token, last)
	// Nor does an expired one, nor another lease: one sequence for all.
	other := b.acquire(t, "other", "h", time.Minute)
	require.Greater(t, other.Token, l.Token)
}

// Expiry is judged by the database clock inside each statement: a holder
// whose renewals run inside one long transaction (where now() is frozen)
// cannot keep an expired lease alive.
func TestLeaseExpiryByDatabaseClockInLongTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	l, err := b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: "long", Holder: "h", TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	_, err = b.leases.RenewTx(b.ctx, tx, lease.Lease{Name: "long", Token: l.Token}, 300*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	_, err = b.leases.RenewTx(b.ctx, tx, lease.Lease{Name: "long", Token: l.Token}, 300*time.Millisecond)
	require.ErrorIs(t, err, lease.ErrLost, "now() would still say the lease is fresh")
	// Inside the same transaction a new acquirer takes it.
	l2, err := b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: "long", Holder: "h2", TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, l2.Token, l.Token)
	require.NoError(t, tx.Commit(b.ctx))

	// With the database clock pinned (pgquota.clock()), a lease whose expiry
	// is past by the database clock is expired, whatever the local clock.
	b.setClock(t, "2100-01-01T00:00:00Z")
	l3, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "long", Holder: "h3", TTL: time.Second})
	require.NoError(t, err, "by the database clock, h2's lease ended in the past")
	require.Equal(t, "2100-01-01T00:00:01Z", l3.ExpiresAt.UTC().Format(time.RFC3339))
}

func TestLeaseAcquireWait(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	t.Run("woken by release", func(t *testing.T) {
		pgtest.NeedsSession(t, "waits for LISTEN's wake-up on a release, which Config.Pooler = PoolerTransaction turns off; TestPoolerTransactionLeavesNoListen covers waiting behind the pooler")
		l := b.acquire(t, "w1", "first", time.Minute)
		got := make(chan lease.Lease, 1)
		errc := make(chan error, 1)
		start := time.Now()
		go func() {
			// Polling alone would not retry within the test's timeout.
			w, err := b.leases.AcquireWait(b.ctx, lease.AcquireRequest{Name: "w1", Holder: "second", TTL: time.Minute},
				&lease.WaitOptions{MinInterval: 20 * time.Second, MaxInterval: 20 * time.Second})
			got <- w
			errc <- err
		}()
		time.Sleep(300 * time.Millisecond)
		_, err := b.leases.Release(b.ctx, lease.Lease{Name: "w1", Token: l.Token})
		require.NoError(t, err)
		require.NoError(t, <-errc)
		w := <-got
		require.Greater(t, w.Token, l.Token)
		// Polling would retry after 20 s: anything well below it was a wake-up,
		// with room for a machine at a load of 20.
		require.Less(t, time.Since(start), 15*time.Second, "a release wakes the waiter")
	})

	t.Run("polling until expiry without LISTEN", func(t *testing.T) {
		l := b.acquire(t, "w2", "first", 300*time.Millisecond)
		w, err := b.leases.AcquireWait(b.ctx, lease.AcquireRequest{Name: "w2", Holder: "second", TTL: time.Minute},
			&lease.WaitOptions{NoListen: true})
		require.NoError(t, err)
		require.Greater(t, w.Token, l.Token)
	})

	t.Run("context ends first", func(t *testing.T) {
		b.acquire(t, "w3", "first", time.Minute)
		ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
		defer cancel()
		_, err := b.leases.AcquireWait(ctx, lease.AcquireRequest{Name: "w3", Holder: "second", TTL: time.Minute}, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, lease.ErrHeld)
	})
}

// The lease and fence paths take no advisory locks and keep no session
// state, so they work behind a transaction-mode pooler: here every
// statement runs in exec mode (no prepared statements, as PgBouncer before
// 1.21 needs) and no advisory lock is ever held.
func TestLeaseNoSessionState(t *testing.T) {
	t.Parallel()
	cfg := pgtest.NewURL(t)
	pool := pgtest.Connect(t, cfg+"&default_query_exec_mode=exec", 4)
	c, err := quota.New(pool, nil)
	require.NoError(t, err)
	ctx := context.Background()
	advisory := func() int {
		var n int
		// pg_locks spans the whole server: count this database's locks only.
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n))
		return n
	}
	l, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: "r", Holder: "h", TTL: time.Minute})
	require.NoError(t, err)
	require.Zero(t, advisory())
	_, err = fenceOf(t, c).WriteRow(ctx, fence.WriteRowRequest{Resource: "r", Key: "k", Value: "v", Token: l.Token, Lease: "r"})
	require.NoError(t, err)
	_, err = leaseOf(t, c).Renew(ctx, lease.Lease{Name: "r", Token: l.Token}, time.Minute)
	require.NoError(t, err)
	require.Zero(t, advisory())
	_, err = leaseOf(t, c).Release(ctx, lease.Lease{Name: "r", Token: l.Token})
	require.NoError(t, err)
	l2, err := leaseOf(t, c).AcquireWait(ctx, lease.AcquireRequest{Name: "r", Holder: "h", TTL: time.Minute}, &lease.WaitOptions{NoListen: true})
	require.NoError(t, err)
	require.Greater(t, l2.Token, l.Token)
	require.Zero(t, advisory())
}

// lockLeaseRow holds the lease row locked in a transaction until the
// returned function is called, so that statements on it hang.
func (b *testBundle) lockLeaseRow(t *testing.T, name string) (unlock func()) {
	t.Helper()
	// As the owner: FOR UPDATE needs UPDATE on the table, which no pgquota
	// role holds.
	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM pgquota.lease WHERE name = $1 FOR UPDATE`, name)
	require.NoError(t, err)
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(unlock)
	return unlock
}

// dbExpired reports whether the lease has expired by the database clock.
func (b *testBundle) dbExpired(t *testing.T, name string) bool {
	t.Helper()
	var expired bool
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT expires_at <= clock_timestamp() FROM pgquota.lease WHERE name = $1`, name).Scan(&expired))
	return expired
}
