package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// A release runs pg_notify only when a waiter is registered for its lease
// (migrations/00013_lease_waiter.sql): NOTIFY's database-wide commit lock
// serialised every release behind the WAL flush of the one before.

type notifyBundle struct {
	ctx    context.Context
	dbURL  string
	pool   *pgxpool.Pool // the application's pool (through the pooler under PGQUOTA_TEST_POOLER)
	client *quota.Client
	leases *lease.Client
	owner  *pgxpool.Pool // direct, as the owner: pg_stat_activity, sentinels
	listen *pgx.Conn     // direct, LISTENing on lease.NotifyChannel
}

func setupNotify(t *testing.T) *notifyBundle {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	b := &notifyBundle{ctx: context.Background(), dbURL: dbURL}
	b.pool = pgtest.Connect(t, pgtest.PoolURL(t, dbURL), 8)
	var err error
	b.client, err = quota.New(b.pool, testConfig(t, nil))
	require.NoError(t, err)
	b.leases = leaseOf(t, b.client)
	b.owner = pgtest.ConnectOwner(t, dbURL, 4)
	direct := dbURL
	if pgtest.AppRoleMode() {
		direct = pgtest.SuiteURL(t, dbURL)
	}
	b.listen, err = pgx.Connect(b.ctx, direct)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.listen.Close(context.Background()) })
	_, err = b.listen.Exec(b.ctx, "LISTEN "+lease.NotifyChannel)
	require.NoError(t, err)
	return b
}

// firstNotification sends a sentinel notification (committed after
// everything before the call) and returns the payload of the first
// notification the listener receives: the sentinel when nothing committed
// before it notified. Notifications arrive in commit order, so no timing
// is involved.
func (b *notifyBundle) firstNotification(t *testing.T) string {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, `SELECT pg_notify($1, 'sentinel')`, lease.NotifyChannel)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	n, err := b.listen.WaitForNotification(ctx)
	require.NoError(t, err, "not even the sentinel arrived")
	if n.Payload != "sentinel" {
		// Drain the sentinel, so that the next call starts clean.
		s, err := b.listen.WaitForNotification(ctx)
		require.NoError(t, err)
		require.Equal(t, "sentinel", s.Payload)
	}
	return n.Payload
}

// waitForAdvisoryWait waits until a backend of the test's database waits
// for an advisory lock.
func (b *notifyBundle) waitForAdvisoryWait(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		// pg_locks, unlike pg_stat_activity's wait events, shows every
		// role's sessions to every role.
		require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n))
		return n > 0
	}, 30*time.Second, 5*time.Millisecond, "nothing waits for the waiter lock")
}

// readCommitted reports whether the test's sessions run READ COMMITTED
// (CI also runs the suite with default_transaction_isolation =
// serializable, where every release notifies and takes no waiter lock).
func (b *notifyBundle) readCommitted(t *testing.T) bool {
	t.Helper()
	var iso string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT current_setting('transaction_isolation')`).Scan(&iso))
	return iso == "read committed"
}

func (b *notifyBundle) waiterRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.lease_waiter`).Scan(&n))
	return n
}

func TestLeaseReleaseNotifiesOnlyWhenAWaiterIsRegistered(t *testing.T) {
	t.Parallel()
	b := setupNotify(t)
	rc := b.readCommitted(t)
	acquire := func(name string) lease.Lease {
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, Holder: "h", TTL: time.Minute})
		require.NoError(t, err)
		return l
	}
	for _, tc := range []struct {
		name     string
		lifetime string // a registration made before the release; "" for none
		want     string // the first notification after the release
	}{
		{name: "nobody waits", want: "sentinel"},
		{name: "a waiter is registered", lifetime: "1 minute", want: "a waiter is registered"},
		{name: "the registration expired", lifetime: "-1 second", want: "sentinel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := acquire(tc.name)
			if tc.lifetime != "" {
				_, err := b.pool.Exec(b.ctx, `SELECT pgquota.lease_wait_register($1, 'w', $2::interval)`, tc.name, tc.lifetime)
				require.NoError(t, err)
			}
			r, err := b.leases.Release(b.ctx, lease.Lease{Name: tc.name, Token: l.Token})
			require.NoError(t, err)
			require.False(t, r.Held)
			want := tc.want
			if !rc {
				want = tc.name // outside READ COMMITTED every release notifies
			}
			require.Equal(t, want, b.firstNotification(t))
		})
	}

	t.Run("repeatable read always notifies", func(t *testing.T) {
		l := acquire("rr")
		tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		_, err = b.leases.ReleaseTx(b.ctx, tx, lease.Lease{Name: "rr", Token: l.Token})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.ctx))
		require.Equal(t, "rr", b.firstNotification(t))
	})

	t.Run("a registration is removed by the next registration of the name once expired", func(t *testing.T) {
		_, err := b.pool.Exec(b.ctx, `SELECT pgquota.lease_wait_register('gc', 'old', '-1 second')`)
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `SELECT pgquota.lease_wait_register('gc', 'new', '1 minute')`)
		require.NoError(t, err)
		var waiters []string
		rows, err := b.owner.Query(b.ctx, `SELECT waiter FROM pgquota.lease_waiter WHERE name = 'gc'`)
		require.NoError(t, err)
		waiters, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"new"}, waiters)
	})
}

// The two interleavings that could lose a wake-up, forced with open
// transactions: a release checks for waiters while a registration is not
// yet committed, and a registration commits while a release is not yet
// committed.
func TestLeaseReleaseAndWaiterRegistrationNeverLoseAWakeup(t *testing.T) {
	t.Parallel()
	b := setupNotify(t)
	rc := b.readCommitted(t)

	t.Run("registration first: the release waits for it, then notifies", func(t *testing.T) {
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "reg-first", Holder: "h", TTL: time.Minute})
		require.NoError(t, err)
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = tx.Exec(b.ctx, `SELECT pgquota.lease_wait_register('reg-first', 'w', '1 minute')`)
		require.NoError(t, err)
		released := make(chan error, 1)
		go func() {
			_, err := b.leases.Release(b.ctx, lease.Lease{Name: "reg-first", Token: l.Token})
			released <- err
		}()
		// The release's snapshot could not see the uncommitted
		// registration: it must wait for its commit and look again
		// (outside READ COMMITTED it notifies without looking).
		if rc {
			b.waitForAdvisoryWait(t)
		}
		require.NoError(t, tx.Commit(b.ctx))
		require.NoError(t, <-released)
		require.Equal(t, "reg-first", b.firstNotification(t))
	})

	t.Run("release first: the registration waits for its commit, so the next attempt sees it", func(t *testing.T) {
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "rel-first", Holder: "h", TTL: time.Minute})
		require.NoError(t, err)
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = b.leases.ReleaseTx(b.ctx, tx, lease.Lease{Name: "rel-first", Token: l.Token})
		require.NoError(t, err)
		registered := make(chan error, 1)
		go func() {
			_, err := b.pool.Exec(b.ctx, `SELECT pgquota.lease_wait_register('rel-first', 'w', '1 minute')`)
			registered <- err
		}()
		if rc {
			b.waitForAdvisoryWait(t)
			select {
			case err := <-registered:
				t.Fatalf("the registration returned before the release committed: %v", err)
			default:
			}
		}
		require.NoError(t, tx.Commit(b.ctx))
		require.NoError(t, <-registered)
		// The waiter's attempt after its registration finds the lease free.
		l2, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "rel-first", Holder: "w", TTL: time.Minute})
		require.NoError(t, err)
		require.Greater(t, l2.Token, l.Token)
	})
}

// Waiters on two Clients (replicas), each polling only once a minute, are
// all woken by releases on the other Client that race with their
// registration, and leave no registration behind.
func TestAcquireWaitWokenByReleaseRacingItsRegistration(t *testing.T) {
	t.Parallel()
	pgtest.NeedsSession(t, "waits for LISTEN's wake-up on a release, which Config.Pooler = PoolerTransaction turns off")
	b := setupNotify(t)
	waiterPool := pgtest.Connect(t, pgtest.PoolURL(t, b.dbURL), 8)
	waiters, err := quota.New(waiterPool, testConfig(t, nil))
	require.NoError(t, err)

	const names = 24
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, names)
	for i := range names {
		name := fmt.Sprintf("race-%d", i)
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, Holder: "holder", TTL: time.Hour})
		require.NoError(t, err)
		wg.Add(2)
		go func() {
			defer wg.Done()
			// Polling alone would wait 30 s at least (a minute, jittered).
			w, err := leaseOf(t, waiters).AcquireWait(b.ctx, lease.AcquireRequest{Name: name, Holder: "waiter", TTL: time.Minute},
				&lease.WaitOptions{MinInterval: time.Minute, MaxInterval: time.Minute})
			if err == nil && w.Token <= l.Token {
				err = fmt.Errorf("%s: waiter's token %d not above the holder's %d", name, w.Token, l.Token)
			}
			errs <- err
		}()
		go func() {
			defer wg.Done()
			// Release before, during or after the waiter's registration.
			time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond)
			if _, err := b.leases.Release(b.ctx, lease.Lease{Name: name, Token: l.Token}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Polling would retry after a minute: anything well below it was a
	// wake-up, with room for a machine at a load of 20.
	require.Less(t, time.Since(start), 45*time.Second, "every waiter was woken by its release, none by polling")
	require.Zero(t, b.waiterRows(t), "registrations left behind")
}
