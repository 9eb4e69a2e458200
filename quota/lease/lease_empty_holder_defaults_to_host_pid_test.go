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

// inTx runs acquire in a transaction of its own on b's pool, committed
// when acquire succeeds.
func inTx[T any](b *testBundle, acquire func(tx pgx.Tx) (T, error)) (v T, err error) {
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		v, err = acquire(tx)
		return err
	})
	return v, err
}

// emptyHolderPath is one acquire path called with an empty holder on key
// (a lease name or a semaphore), as the lease it took.
type emptyHolderPath func(key string) (lease.Lease, error)

// requireEmptyHolderIsHostPID calls each path with an empty holder and
// checks that the lease it took, and its row in pgquota.lease, name
// host:pid; that the lease renews, keeping its token and holder and
// extending its expiry; that another holder (acquireOther, "other" as
// holder) gets whileHeld until it is released, and then takes it with a
// larger token.
func requireEmptyHolderIsHostPID(t *testing.T, b *testBundle, paths map[string]emptyHolderPath,
	acquireOther func(key string) (lease.Lease, error), whileHeld error,
) {
	t.Helper()
	want := hostPID(t)
	for call, acquire := range paths {
		key := "empty-holder-" + call
		l, err := acquire(key)
		require.NoError(t, err, call)
		require.Equal(t, want, l.Holder, call)
		var stored string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT holder FROM pgquota.lease WHERE name = $1`, l.Name).Scan(&stored), call)
		require.Equal(t, want, stored, "%s: the lease row names host:pid", call)

		renewed, err := b.leases.Renew(b.ctx, l, 2*time.Minute)
		require.NoError(t, err, call)
		require.Equal(t, l.Token, renewed.Token, call)
		require.Equal(t, want, renewed.Holder, call)
		require.True(t, renewed.ExpiresAt.After(l.ExpiresAt), "%s: the renewal extends the lease", call)

		_, err = acquireOther(key)
		require.ErrorIs(t, err, whileHeld, "%s: held, so refused", call)
		_, err = b.leases.Release(b.ctx, l)
		require.NoError(t, err, call)
		other, err := acquireOther(key)
		require.NoError(t, err, "%s: released, so free", call)
		require.Greater(t, other.Token, l.Token, call)
		require.Equal(t, "other", other.Holder, call)
	}
}

// An empty AcquireRequest.Holder is stored as host:pid by every acquire
// path (plain, in a transaction, waiting, with a payload), as DoRequest and
// the CLI already did; the lease it returns renews and releases, and
// once released the next acquirer takes it with a larger token.
func TestAcquireWithEmptyHolderStoresHostPIDAndRenewsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	require.Equal(t, hostPID(t), lease.DefaultHolder())

	req := func(name string) lease.AcquireRequest { return lease.AcquireRequest{Name: name, TTL: time.Minute} }
	requireEmptyHolderIsHostPID(t, b, map[string]emptyHolderPath{
		"Acquire": func(name string) (lease.Lease, error) { return b.leases.Acquire(b.ctx, req(name)) },
		"AcquireWithPayload": func(name string) (lease.Lease, error) {
			r := req(name)
			r.Payload = "p"
			return b.leases.Acquire(b.ctx, r)
		},
		"AcquireWait": func(name string) (lease.Lease, error) { return b.leases.AcquireWait(b.ctx, req(name), nil) },
		"AcquireTx": func(name string) (lease.Lease, error) {
			return inTx(b, func(tx pgx.Tx) (lease.Lease, error) { return b.leases.AcquireTx(b.ctx, tx, req(name)) })
		},
	}, func(name string) (lease.Lease, error) {
		r := req(name)
		r.Holder = "other"
		return b.leases.Acquire(b.ctx, r)
	}, lease.ErrHeld)
}

// An empty SlotRequest.Holder is stored as host:pid by AcquireSlot,
// AcquireSlotTx and AcquireSlotWait, and the slot's lease renews and
// releases, freeing the slot.
func TestAcquireSlotWithEmptyHolderStoresHostPIDAndRenewsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	req := func(sem string) lease.SlotRequest {
		return lease.SlotRequest{Semaphore: sem, Limit: 1, TTL: time.Minute}
	}
	slotLease := func(s lease.Slot, err error) (lease.Lease, error) { return s.Lease, err }
	requireEmptyHolderIsHostPID(t, b, map[string]emptyHolderPath{
		"AcquireSlot": func(sem string) (lease.Lease, error) { return slotLease(b.leases.AcquireSlot(b.ctx, req(sem))) },
		"AcquireSlotWait": func(sem string) (lease.Lease, error) {
			return slotLease(b.leases.AcquireSlotWait(b.ctx, req(sem), nil))
		},
		"AcquireSlotTx": func(sem string) (lease.Lease, error) {
			return slotLease(inTx(b, func(tx pgx.Tx) (lease.Slot, error) { return b.leases.AcquireSlotTx(b.ctx, tx, req(sem)) }))
		},
	}, func(sem string) (lease.Lease, error) {
		r := req(sem)
		r.Holder = "other"
		return slotLease(b.leases.AcquireSlot(b.ctx, r))
	}, lease.ErrSemaphoreFull)
}
