package lease_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

func names(ls []lease.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Name
	}
	return out
}

func TestLeasesListByPrefixHeldAndPage(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	a, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "job/a", Holder: "w1", TTL: time.Minute, Payload: "step 1 of 3"})
	require.NoError(t, err)
	require.Equal(t, "step 1 of 3", a.Payload)
	b.acquire(t, "job/b", "w2", time.Minute)
	c := b.acquire(t, "job/c", "w3", time.Minute)
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "job/c", Token: c.Token})
	require.NoError(t, err)
	b.acquire(t, "job_%", "w4", time.Minute) // LIKE's pattern characters are plain here
	b.acquire(t, "other", "w5", time.Minute)

	all, err := b.leases.List(b.ctx, lease.Filter{})
	require.NoError(t, err)
	require.Equal(t, []string{"job/a", "job/b", "job/c", "job_%", "other"}, names(all))

	jobs, err := b.leases.List(b.ctx, lease.Filter{Prefix: "job/"})
	require.NoError(t, err)
	require.Equal(t, []string{"job/a", "job/b", "job/c"}, names(jobs))
	require.Equal(t, "step 1 of 3", jobs[0].Payload)
	require.Equal(t, a.Token, jobs[0].Token)
	require.True(t, jobs[0].Held)
	require.Empty(t, jobs[1].Payload)
	require.False(t, jobs[2].Held)

	held, err := b.leases.List(b.ctx, lease.Filter{Prefix: "job/", HeldOnly: true})
	require.NoError(t, err)
	require.Equal(t, []string{"job/a", "job/b"}, names(held))

	pct, err := b.leases.List(b.ctx, lease.Filter{Prefix: "job_%"})
	require.NoError(t, err)
	require.Equal(t, []string{"job_%"}, names(pct))

	page1, err := b.leases.List(b.ctx, lease.Filter{Prefix: "job", Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"job/a", "job/b"}, names(page1))
	page2, err := b.leases.List(b.ctx, lease.Filter{Prefix: "job", Limit: 2, After: page1[1].Name})
	require.NoError(t, err)
	require.Equal(t, []string{"job/c", "job_%"}, names(page2))

	for _, tc := range []struct {
		f     lease.Filter
		field string
	}{
		{lease.Filter{Limit: -1}, "limit"},
		{lease.Filter{Limit: lease.MaxListLimit + 1}, "limit"},
		{lease.Filter{Prefix: "a\nb"}, "prefix"},
		{lease.Filter{After: strings.Repeat("x", quota.MaxNameBytes+1)}, "after"},
	} {
		_, err := b.leases.List(b.ctx, tc.f)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, tc.field, ie.Field)
	}
}

func TestLeasePayloadBelongsToOneAcquisition(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	first, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "primary", Holder: "a", TTL: time.Minute, Payload: "10.0.0.1:5432"})
	require.NoError(t, err)

	// A retry of the same attempt returns the same lease and payload.
	again, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "primary", Holder: "a", TTL: time.Minute, Attempt: first.Attempt, Payload: "10.0.0.1:5432"})
	require.NoError(t, err)
	require.Equal(t, first.Token, again.Token)
	require.Equal(t, "10.0.0.1:5432", again.Payload)

	// The holder updates it, conditioned on its token.
	upd, err := b.leases.SetPayload(b.ctx, lease.Lease{Name: "primary", Token: first.Token}, "10.0.0.1:6432")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:6432", upd.Payload)
	require.Equal(t, first.ExpiresAt, upd.ExpiresAt, "the expiry is unchanged")
	got, err := b.leases.Get(b.ctx, "primary")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:6432", got.Payload)

	// Taken over: the new holder starts without the old payload, and the
	// deposed holder cannot write one.
	_, err = b.owner.Exec(b.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() WHERE name = 'primary'`)
	require.NoError(t, err)
	second := b.acquire(t, "primary", "b", time.Minute)
	require.Empty(t, second.Payload)
	_, err = b.leases.SetPayload(b.ctx, lease.Lease{Name: "primary", Token: first.Token}, "stale")
	require.ErrorIs(t, err, lease.ErrLost)
	got, err = b.leases.Get(b.ctx, "primary")
	require.NoError(t, err)
	require.Equal(t, second.Token, got.Token)
	require.Empty(t, got.Payload, "neither the old payload nor the stale write shows")

	// An expired lease's payload cannot be changed, even by its holder.
	_, err = b.owner.Exec(b.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() WHERE name = 'primary'`)
	require.NoError(t, err)
	_, err = b.leases.SetPayload(b.ctx, lease.Lease{Name: "primary", Token: second.Token}, "late")
	require.ErrorIs(t, err, lease.ErrLost)

	// Clearing: an empty payload.
	third, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "primary", Holder: "c", TTL: time.Minute, Payload: "x"})
	require.NoError(t, err)
	cleared, err := b.leases.SetPayload(b.ctx, lease.Lease{Name: "primary", Token: third.Token}, "")
	require.NoError(t, err)
	require.Empty(t, cleared.Payload)

	// Bad payloads name the field and write nothing.
	for _, p := range []string{"a\x00b", "\xff", strings.Repeat("x", lease.MaxPayloadBytes+1)} {
		_, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "fresh", Holder: "h", TTL: time.Minute, Payload: p})
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, "payload", ie.Field)
		_, err = b.leases.SetPayload(b.ctx, lease.Lease{Name: "primary", Token: third.Token}, p)
		require.ErrorAs(t, err, &ie)
		require.Equal(t, "payload", ie.Field)
	}
	_, err = b.leases.Get(b.ctx, "fresh")
	require.ErrorIs(t, err, lease.ErrNotFound, "nothing written")
}
