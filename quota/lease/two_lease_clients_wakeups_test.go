package lease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota/lease"
)

// Two lease.Client values on one quota.Client each LISTEN on a connection
// of their own; a release wakes the waiter of either one promptly (well
// before its polling interval), and the second waiter is woken by the
// first one's release in turn: neither client's notifier swallows the
// other's wake-up, and both listeners are gone when the waits end.
func TestTwoLeaseClientsOnOneQuotaClientBothWokenByRelease(t *testing.T) {
	t.Parallel()
	if pgtest.Pooled(t) {
		t.Skip("AcquireWait polls behind a transaction pooler (TestPoolerTransactionLeavesNoListen)")
	}
	b := setup(t, 6)
	l1, err := lease.New(b.client)
	require.NoError(t, err)
	l2, err := lease.New(b.client)
	require.NoError(t, err)
	held := b.acquire(t, "job", "holder", time.Minute)

	slow := &lease.WaitOptions{MinInterval: 20 * time.Second, MaxInterval: 20 * time.Second}
	type got struct {
		c   string
		l   lease.Lease
		err error
		at  time.Time
	}
	done := make(chan got, 2)
	for name, c := range map[string]*lease.Client{"l1": l1, "l2": l2} {
		go func() {
			l, err := c.AcquireWait(b.ctx, lease.AcquireRequest{Name: "job", Holder: name, TTL: time.Minute}, slow)
			done <- got{name, l, err, time.Now()}
		}()
	}
	require.Eventually(t, func() bool { return b.countRows(t, "lease_waiter") == 2 }, 5*time.Second, 10*time.Millisecond, "both waiters registered")
	released := time.Now()
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "job", Token: held.Token})
	require.NoError(t, err)

	var first got
	select {
	case first = <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("no waiter woke within 5s of the release (polling interval 20s)")
	}
	require.NoError(t, first.err)
	t.Logf("%s acquired %s after the release", first.c, first.at.Sub(released).Round(time.Millisecond))

	released = time.Now()
	_, err = map[string]*lease.Client{"l1": l1, "l2": l2}[first.c].Release(b.ctx, lease.Lease{Name: "job", Token: first.l.Token})
	require.NoError(t, err)
	var second got
	select {
	case second = <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the other client's waiter did not wake within 5s of the second release (polling interval 20s)")
	}
	require.NoError(t, second.err)
	require.NotEqual(t, first.c, second.c)
	t.Logf("%s acquired %s after the second release", second.c, second.at.Sub(released).Round(time.Millisecond))

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&n))
		return n == 0
	}, 5*time.Second, 20*time.Millisecond, "no listener left after the waits")
}
