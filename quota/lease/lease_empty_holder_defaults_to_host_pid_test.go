package lease_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/lease"
)

// hostPID is what an empty holder must become, computed here rather than
// with lease.DefaultHolder so that the test checks the documented shape.
func hostPID(t *testing.T) string {
	t.Helper()
	host, err := os.Hostname()
	require.NoError(t, err)
	require.NotEmpty(t, host)
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// An empty AcquireRequest.Holder is stored as host:pid by every acquire
// path (plain, in a transaction, waiting, with a payload), as DoRequest and
// the CLI already did; the lease it returns renews and releases, and
// once released the next acquirer takes it with a larger token.
func TestAcquireWithEmptyHolderStoresHostPIDAndRenewsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	want := hostPID(t)
	require.Equal(t, want, lease.DefaultHolder())

	acquirers := map[string]func(name string) (lease.Lease, error){
		"Acquire": func(name string) (lease.Lease, error) {
			return b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, TTL: time.Minute})
		},
		"AcquireWithPayload": func(name string) (lease.Lease, error) {
			return b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, TTL: time.Minute, Payload: "p"})
		},
		"AcquireWait": func(name string) (lease.Lease, error) {
			return b.leases.AcquireWait(b.ctx, lease.AcquireRequest{Name: name, TTL: time.Minute}, nil)
		},
		"AcquireTx": func(name string) (l lease.Lease, err error) {
			err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				l, err = b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: name, TTL: time.Minute})
				return err
			})
			return l, err
		},
	}
	for call, acquire := range acquirers {
		name := "empty-holder-" + call
		l, err := acquire(name)
		require.NoError(t, err, call)
		require.Equal(t, want, l.Holder, call)
		var stored string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT holder FROM pgquota.lease WHERE name = $1`, name).Scan(&stored), call)
		require.Equal(t, want, stored, "%s: the row names host:pid", call)

		renewed, err := b.leases.Renew(b.ctx, name, l.Token, 2*time.Minute)
		require.NoError(t, err, call)
		require.Equal(t, l.Token, renewed.Token, call)
		require.Equal(t, want, renewed.Holder, call)
		require.True(t, renewed.ExpiresAt.After(l.ExpiresAt), "%s: the renewal extends the lease", call)

		_, err = b.leases.Release(b.ctx, name, l.Token)
		require.NoError(t, err, call)
		next, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, Holder: "next", TTL: time.Minute})
		require.NoError(t, err, "%s: released, so free", call)
		require.Greater(t, next.Token, l.Token, call)
		require.Equal(t, "next", next.Holder, call)
	}
}

// An empty SlotRequest.Holder is stored as host:pid by AcquireSlot,
// AcquireSlotTx and AcquireSlotWait, and the slot's lease renews and
// releases, freeing the slot.
func TestAcquireSlotWithEmptyHolderStoresHostPIDAndRenewsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	want := hostPID(t)

	acquirers := map[string]func(sem string) (lease.Slot, error){
		"AcquireSlot": func(sem string) (lease.Slot, error) {
			return b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 1, TTL: time.Minute})
		},
		"AcquireSlotWait": func(sem string) (lease.Slot, error) {
			return b.leases.AcquireSlotWait(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 1, TTL: time.Minute}, nil)
		},
		"AcquireSlotTx": func(sem string) (s lease.Slot, err error) {
			err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				s, err = b.leases.AcquireSlotTx(b.ctx, tx, lease.SlotRequest{Semaphore: sem, Limit: 1, TTL: time.Minute})
				return err
			})
			return s, err
		},
	}
	for call, acquire := range acquirers {
		sem := "empty-holder-" + call
		s, err := acquire(sem)
		require.NoError(t, err, call)
		require.Equal(t, want, s.Holder, call)
		var stored string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT holder FROM pgquota.lease WHERE name = $1`, s.Name).Scan(&stored), call)
		require.Equal(t, want, stored, "%s: the slot's lease row names host:pid", call)

		renewed, err := b.leases.Renew(b.ctx, s.Name, s.Token, 2*time.Minute)
		require.NoError(t, err, call)
		require.Equal(t, s.Token, renewed.Token, call)

		_, err = b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 1, Holder: "other", TTL: time.Minute})
		require.ErrorIs(t, err, lease.ErrSemaphoreFull, "%s: the one slot is held", call)
		_, err = b.leases.Release(b.ctx, s.Name, s.Token)
		require.NoError(t, err, call)
		other, err := b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 1, Holder: "other", TTL: time.Minute})
		require.NoError(t, err, "%s: released, so the slot is free", call)
		require.Greater(t, other.Token, s.Token, call)
	}
}
