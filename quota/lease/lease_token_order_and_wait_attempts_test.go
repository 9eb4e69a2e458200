package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/lease"
)

// Tokens strictly increase per resource "across acquisitions,
// releases and row deletions". The acquire statement takes its token
// (nextval) when it builds the row it proposes to insert, before the insert
// checks for a conflict. If the lease row is deleted (say, a cleanup of
// expired leases) while an acquire sits between those two steps, and another
// acquisition came in between, the slow acquire inserts a token older than
// its predecessor's. The pause is injected with a BEFORE INSERT trigger that
// waits on an advisory lock held by the test.
func TestBreakLeaseTokenGoesBackAfterRowDeletion(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	// DDL on purpose, as the owner.
	_, err := b.owner.Exec(b.ctx, `
		CREATE FUNCTION pgquota.test_pause() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.holder = 'slow' THEN
				PERFORM pg_advisory_xact_lock(4242);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_pause BEFORE INSERT ON pgquota.lease
			FOR EACH ROW EXECUTE FUNCTION pgquota.test_pause();`)
	require.NoError(t, err)

	// The gate is a transaction's advisory lock, so that the test also
	// runs behind a transaction pooler (PGQUOTA_TEST_POOLER).
	gate, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = gate.Rollback(b.ctx) }()
	_, err = gate.Exec(b.ctx, `SELECT pg_advisory_xact_lock(4242)`)
	require.NoError(t, err)

	type out struct {
		l   lease.Lease
		err error
	}
	slow := make(chan out, 1)
	go func() {
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r", Holder: "slow", TTL: time.Minute})
		slow <- out{l, err}
	}()
	// Wait until the slow acquire has its token and waits in the trigger.
	require.Eventually(t, func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n)
		return n == 1
	}, 10*time.Second, 10*time.Millisecond)

	// Another acquisition comes in, is released, and the released and
	// expired lease rows are cleaned up.
	fastc := make(chan out, 1)
	go func() {
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r", Holder: "fast", TTL: time.Minute})
		if err == nil {
			if _, err = b.leases.Release(b.ctx, lease.Lease{Name: "r", Token: l.Token}); err == nil {
				_, err = b.owner.Exec(b.ctx, `DELETE FROM pgquota.lease WHERE expires_at <= clock_timestamp()`)
			}
		}
		fastc <- out{l, err}
	}()
	var fast out
	fastFirst := false
	select {
	case fast = <-fastc:
		fastFirst = true
	case <-time.After(time.Second):
	}

	require.NoError(t, gate.Rollback(b.ctx))
	got := <-slow
	require.NoError(t, got.err)
	if fastFirst {
		require.NoError(t, fast.err)
		require.Greater(t, got.l.Token, fast.l.Token,
			"the acquisition after %q's (token %d) must get a larger token", "fast", fast.l.Token)
		return
	}
	// The fast acquisition waited for the slow one: it finds the lease held,
	// or (had it been released) takes a larger token.
	fast = <-fastc
	if fast.err == nil {
		require.Greater(t, fast.l.Token, got.l.Token)
	} else {
		require.ErrorIs(t, fast.err, lease.ErrHeld)
	}
}

// AcquireWait's LISTEN connection is taken from the pool before the first
// attempt. When the caller (or the rest of the application) holds all but
// one of the pool's connections, the listener takes the last one and every
// attempt waits for a connection that never comes: a free lease is not
// acquired until the context ends (forever, with no deadline). With
// WaitOptions.NoListen the same call returns at once.
func TestBreakAcquireWaitListenerStarvesAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	busy, err := b.pool.Acquire(b.ctx) // the application's own work
	require.NoError(t, err)
	defer busy.Release()

	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	l, err := b.leases.AcquireWait(ctx, lease.AcquireRequest{Name: "free", Holder: "h", TTL: time.Minute},
		&lease.WaitOptions{NoListen: true})
	require.NoError(t, err, "NoListen")
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "free", Token: l.Token})
	require.NoError(t, err)

	start := time.Now()
	_, err = b.leases.AcquireWait(ctx, lease.AcquireRequest{Name: "free", Holder: "h", TTL: time.Minute}, nil)
	require.NoError(t, err, "a free lease, after %s", time.Since(start).Round(time.Millisecond))
}
