// Package lease is pgquota's fenced lock (after Martin Kleppmann, "How to
// do distributed locking", 2016): leases with fencing tokens, and what is
// built on them, as etcd's clientv3/concurrency builds Session, Mutex and
// Election on its client: Do (run work under a lease kept alive), Keepalive,
// Election (one leader at a time, with Observe) and semaphores (at most N
// holders at once, each slot a lease with its own token).
//
// A lease grants its holder a fencing token that strictly increases with
// every acquisition; package fence makes the storage reject writes that
// carry a stale one, so a holder paused past its TTL cannot overwrite its
// successor's work:
//
//	q, _ := quota.New(pool, nil)
//	leases, _ := lease.New(q)
//	err := leases.Do(ctx, lease.DoRequest{Name: "nightly-report", TTL: 10 * time.Second},
//		func(ctx context.Context) error {
//			l, _ := lease.FromContext(ctx)
//			return writeReport(ctx, l.Token) // a fenced write (package fence)
//		})
//
// Every expiry is judged by the database clock, never by the application's,
// so clock skew between servers cannot make two of them hold one lease.
// Behind a transaction pooler (quota.Config.Pooler = quota.PoolerTransaction)
// AcquireWait polls instead of LISTENing.
//
// Tokens survive crashes and failovers (migrations/00007_token_epoch.sql):
// a token is (epoch << 40) + n with the epoch from the server's WAL
// timeline, so tokens issued after the promotion of a standby exceed every
// token issued before it, whatever the replication lag (see Epoch).
// Acquire, Renew, Release, fenced writes and writes of guarded tables
// raise their transaction's synchronous_commit from off to on (inside the
// caller's transaction for the Tx twins), so none that reported success is
// lost in a crash and no token is issued twice; 'local' and the remote
// levels are kept, as they flush the local WAL already.
//
// Errors: this package's sentinels (ErrHeld, ErrLost, ErrNotFound, ...,
// tested with errors.Is) and package quota's: *quota.InputError for bad
// arguments, quota.ErrSchemaMissing, quota.ErrPermissionDenied,
// quota.ErrOutcomeUnknown.
package lease
