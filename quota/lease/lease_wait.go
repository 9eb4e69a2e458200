package lease

import (
	"context"
	"time"

	"github.com/pgquota/pgquota/db"
)

// A release notifies only when a waiter is registered for its lease
// (migrations/00013_lease_waiter.sql): NOTIFY takes a database-wide lock
// at commit, which made concurrent releases of different leases queue
// behind each other's WAL flush. AcquireWait, once it LISTENs, registers
// itself before each attempt (refreshing the registration while it
// waits), and removes the registration when the wait ends.

// waitRegistration is how long a waiter's registration lasts by the
// database clock unless refreshed: a waiter that dies without removing it
// makes the lease's releases notify for at most this long.
const waitRegistration = time.Minute

// leaseWaiter is one AcquireWait call's registration as a waiter.
type leaseWaiter struct {
	c      *Client
	name   string
	waiter string
	// refreshAt is the local (monotonic) time after which the
	// registration is refreshed before the next attempt; zero before the
	// first registration.
	refreshAt time.Time
	// failed reports that the last registration failed: releases may not
	// notify, so the waiter polls at the poller's pace.
	failed bool
}

// register registers (or refreshes, past half its lifetime) the waiter,
// so that a release committed after the call returns notifies. It must
// be called after LISTEN is in place and before the attempt it covers.
// It reports whether the waiter is registered; a failure leaves the
// waiter polling (notifications are only a hint).
func (w *leaseWaiter) register(ctx context.Context) bool {
	if !w.refreshAt.IsZero() && time.Now().Before(w.refreshAt) {
		return true
	}
	sent := time.Now()
	_, err := w.c.core.Queries.LeaseWaitRegister(ctx, w.c.core.DB, db.LeaseWaitRegisterParams{
		Name: w.name, Waiter: w.waiter, Lifetime: intervalOf(waitRegistration),
	})
	if err != nil {
		w.refreshAt, w.failed = time.Time{}, true
		return false
	}
	w.refreshAt, w.failed = sent.Add(waitRegistration/2), false
	return true
}

// unregister removes the registration, if one was made, under its own
// short timeout so that an ended ctx still removes it.
func (w *leaseWaiter) unregister(ctx context.Context) {
	if w.refreshAt.IsZero() && !w.failed {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = w.c.core.Queries.LeaseWaitUnregister(uctx, w.c.core.DB, db.LeaseWaitUnregisterParams{Name: w.name, Waiter: w.waiter})
}

// pollerMaxInterval is AcquireWait's default WaitOptions.MaxInterval when
// nothing wakes a waiter early on a release (quota.Config.Pooler is
// quota.PoolerTransaction, or WaitOptions.NoListen): a release is then noticed
// within about this long.
const pollerMaxInterval = 100 * time.Millisecond
