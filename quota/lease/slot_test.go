package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// acquireSlot takes a slot of sem (limit n) or fails the test.
func (b *testBundle) acquireSlot(t *testing.T, c *quota.Client, sem string, n int, holder string, ttl time.Duration) lease.Slot {
	t.Helper()
	s, err := leaseOf(t, c).AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: n, Holder: holder, TTL: ttl})
	require.NoError(t, err, "%s acquires a slot of %s", holder, sem)
	return s
}

// heldSlots counts the held slots of sem as the database sees them, by its
// clock, in one statement.
func (b *testBundle) heldSlots(t *testing.T, sem string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT count(*) FROM pgquota.lease WHERE starts_with(name, 'slot:' || $1::text || ':') AND expires_at > clock_timestamp()`,
		sem).Scan(&n))
	return n
}

// A semaphore of 3: three holders get slots 0, 1, 2 with increasing tokens;
// the fourth gets *SemaphoreFullError naming 3 holders and a retry time
// within the TTL; a release lets the next one in on the freed slot with a
// larger token; the same Attempt again returns its slot unchanged; renew
// keeps the token and moves the expiry; Semaphore lists exactly the holders.
func TestSlotAcquireFullReleaseRenewAndListing(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const sem = "encoders"
	var slots []lease.Slot
	for i, h := range []string{"a", "b", "c"} {
		s := b.acquireSlot(t, b.client, sem, 3, h, time.Minute)
		require.Equal(t, i, s.Index)
		require.Equal(t, lease.SlotName(sem, i), s.Name)
		require.Equal(t, i+1, s.Holders)
		require.True(t, s.Held)
		if i > 0 {
			require.Greater(t, s.Token, slots[i-1].Token)
		}
		slots = append(slots, s)
	}
	_, err := b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 3, Holder: "d", TTL: time.Minute})
	var full *lease.SemaphoreFullError
	require.ErrorAs(t, err, &full)
	require.ErrorIs(t, err, lease.ErrSemaphoreFull)
	require.Equal(t, 3, full.Holders)
	require.Equal(t, 3, full.Limit)
	require.Greater(t, full.RetryAfter, 50*time.Second)
	require.LessOrEqual(t, full.RetryAfter, time.Minute)

	rel, err := b.leases.ReleaseSlot(b.ctx, slots[1])
	require.NoError(t, err)
	require.False(t, rel.Held)
	attempt := lease.NewAttempt()
	d, err := b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 3, Holder: "d", TTL: time.Minute, Attempt: attempt})
	require.NoError(t, err)
	require.Equal(t, 1, d.Index, "the freed slot")
	require.Greater(t, d.Token, slots[2].Token)
	again, err := b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: sem, Limit: 3, Holder: "d", TTL: time.Minute, Attempt: attempt})
	require.NoError(t, err, "the same attempt gets its slot back")
	require.Equal(t, d.Token, again.Token)
	require.Equal(t, d.Index, again.Index)

	r, err := b.leases.RenewSlot(b.ctx, slots[0], 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, slots[0].Token, r.Token)
	require.True(t, r.ExpiresAt.After(slots[0].ExpiresAt))
	_, err = b.leases.RenewSlot(b.ctx, slots[1], time.Minute)
	require.ErrorIs(t, err, lease.ErrLost, "a released slot cannot be renewed")

	st, err := b.leases.Semaphore(b.ctx, sem)
	require.NoError(t, err)
	require.Equal(t, 3, st.Limit)
	require.Equal(t, 3, st.Held)
	require.Equal(t, int64(4), st.Acquisitions)
	var holders []string
	for _, s := range st.Holders() {
		holders = append(holders, s.Holder)
	}
	require.Equal(t, []string{"a", "d", "c"}, holders)
	require.Equal(t, 3, b.heldSlots(t, sem))

	_, err = b.leases.Semaphore(b.ctx, "never")
	require.ErrorIs(t, err, lease.ErrSemaphoreNotFound)
}

// Keepalive takes a slot's lease as it is: it renews the slot past its TTL,
// and Stop ends the renewals; the slot is then free once its TTL runs out.
func TestSlotKeepaliveKeepsTheSlotPastItsTTL(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	// A TTL long enough for renewals every TTL/3 on a loaded machine.
	const ttl = time.Second
	s := b.acquireSlot(t, b.client, "kept", 1, "a", ttl)
	k, err := b.leases.Keepalive(b.ctx, s.Lease, nil)
	require.NoError(t, err)
	time.Sleep(5 * ttl / 2)
	require.NoError(t, k.Context().Err(), "the work context is alive")
	_, err = b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: "kept", Limit: 1, Holder: "b", TTL: ttl})
	require.ErrorIs(t, err, lease.ErrSemaphoreFull, "kept past its TTL")
	require.Equal(t, s.Token, k.Lease().Token)
	require.NoError(t, k.Stop())
	_, err = b.leases.AcquireSlotWait(b.ctx, lease.SlotRequest{Semaphore: "kept", Limit: 1, Holder: "b", TTL: ttl}, nil)
	require.NoError(t, err, "free once the renewals stopped and the TTL ran out")
}

// Lowering the limit while held: with 4 holders and the limit stated as 2,
// nobody gets in (4, then 3, then 2 held are not below 2); once only one
// holds, the next acquirer gets a slot below the new limit, and then the
// semaphore is full at 2. The holders above the new limit keep renewing.
func TestSlotLimitLoweredWhileHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const sem = "lowered"
	var held []lease.Slot
	for i := range 4 {
		held = append(held, b.acquireSlot(t, b.client, sem, 4, string(rune('a'+i)), time.Minute))
	}
	lower := lease.SlotRequest{Semaphore: sem, Limit: 2, Holder: "new", TTL: time.Minute}
	for _, release := range []int{0, 1} {
		_, err := b.leases.AcquireSlot(b.ctx, lower)
		var full *lease.SemaphoreFullError
		require.ErrorAs(t, err, &full)
		require.Equal(t, 4-release, full.Holders)
		_, err = b.leases.ReleaseSlot(b.ctx, held[release])
		require.NoError(t, err)
	}
	_, err := b.leases.AcquireSlot(b.ctx, lower)
	require.ErrorIs(t, err, lease.ErrSemaphoreFull, "2 held, limit 2")
	_, err = b.leases.RenewSlot(b.ctx, held[3], time.Minute)
	require.NoError(t, err, "a holder above the lowered limit keeps renewing")
	st, err := b.leases.Semaphore(b.ctx, sem)
	require.NoError(t, err)
	require.Equal(t, 2, st.Limit, "the last limit stated")

	_, err = b.leases.ReleaseSlot(b.ctx, held[2])
	require.NoError(t, err)
	s, err := b.leases.AcquireSlot(b.ctx, lower)
	require.NoError(t, err)
	require.Less(t, s.Index, 2, "a slot below the new limit")
	require.Equal(t, 2, s.Holders)
	_, err = b.leases.AcquireSlot(b.ctx, lower)
	require.ErrorIs(t, err, lease.ErrSemaphoreFull)
	require.Equal(t, 2, b.heldSlots(t, sem))
}

// A slot's lease cannot be taken through the lease API (which would bypass
// the count): Acquire of a slot name fails with SQLSTATE PQ012, free or
// held, and writes nothing.
func TestSlotLeaseNotAcquirableAsLease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	s := b.acquireSlot(t, b.client, "guarded", 1, "a", 250*time.Millisecond)
	// Held or free, a slot's name is refused as a lease (PQ012), before the
	// lease statement looks at the row.
	for _, name := range []string{s.Name, lease.SlotName("guarded", 1), lease.SlotName("other", 0)} {
		_, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, Holder: "sneak", TTL: time.Minute})
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", name, err)
		require.Equal(t, lease.SQLStateSlotLease, pgErr.Code, name)
	}
	time.Sleep(300 * time.Millisecond)
	_, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: s.Name, Holder: "sneak", TTL: time.Minute})
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "expired, still not acquirable as a lease: %v", err)
	require.Equal(t, lease.SQLStateSlotLease, pgErr.Code)
	l, err := b.leases.Get(b.ctx, s.Name)
	require.NoError(t, err)
	require.Equal(t, s.Token, l.Token, "the slot's row is unchanged")
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.lease`).Scan(&n))
	require.Equal(t, 1, n, "only the slot's own row")
}

// Bad input names the field and writes nothing: no semaphore row, no lease
// row, no token taken.
func TestSlotBadInputNamesTheFieldAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ok := lease.SlotRequest{Semaphore: "s", Limit: 2, Holder: "h", TTL: time.Second}
	cases := []struct {
		name  string
		edit  func(*lease.SlotRequest)
		field string
	}{
		{"limit 0", func(r *lease.SlotRequest) { r.Limit = 0 }, "limit"},
		{"negative limit", func(r *lease.SlotRequest) { r.Limit = -1 }, "limit"},
		{"limit above max", func(r *lease.SlotRequest) { r.Limit = lease.MaxSlotLimit + 1 }, "limit"},
		{"empty name", func(r *lease.SlotRequest) { r.Semaphore = "" }, "semaphore"},
		{"long name", func(r *lease.SlotRequest) { r.Semaphore = string(make([]byte, lease.MaxSemaphoreNameBytes+1)) }, "semaphore"},
		{"control character", func(r *lease.SlotRequest) { r.Semaphore = "a\nb" }, "semaphore"},
		{"TTL below MinLeaseTTL", func(r *lease.SlotRequest) { r.TTL = lease.MinTTL - time.Microsecond }, "ttl"},
		{"zero TTL", func(r *lease.SlotRequest) { r.TTL = 0 }, "ttl"},
		{"TTL above MaxLeaseTTL", func(r *lease.SlotRequest) { r.TTL = lease.MaxTTL + time.Second }, "ttl"},
		{"control character in holder", func(r *lease.SlotRequest) { r.Holder = "h\n" }, "holder"},
	}
	ctx := context.Background()
	for _, tc := range cases {
		req := ok
		tc.edit(&req)
		for call, f := range map[string]func() error{
			"AcquireSlot": func() error { _, err := b.leases.AcquireSlot(ctx, req); return err },
			"AcquireSlotWait": func() error {
				_, err := b.leases.AcquireSlotWait(ctx, req, nil)
				return err
			},
		} {
			err := f()
			require.ErrorIs(t, err, quota.ErrInvalidInput, "%s %s", call, tc.name)
			var ie *quota.InputError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.field, ie.Field, "%s %s: %v", call, tc.name, err)
		}
	}
	var sems, leases int
	var lastToken int64
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgquota.semaphore), (SELECT count(*) FROM pgquota.lease),
		(SELECT last_value FROM pgquota.lease_token)`).Scan(&sems, &leases, &lastToken))
	require.Zero(t, sems, "no semaphore row")
	require.Zero(t, leases, "no lease row")
	require.Equal(t, int64(1), lastToken, "no token taken")
}
