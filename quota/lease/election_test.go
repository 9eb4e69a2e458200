package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

func TestElectionOneLeaderAtATimeAndResignHandsOver(t *testing.T) {
	t.Parallel()
	pool, clients := replicas(t, 3)
	createRunLog(t, pool)
	ctx := context.Background()
	const ttl = 6 * time.Second

	observer, err := leaseOf(t, clients[0]).NewElection("leader", lease.ElectionOptions{Holder: "observer", TTL: ttl})
	require.NoError(t, err)

	const terms = 4
	errs := make(chan error, 3*terms)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			who := fmt.Sprintf("node-%d", i)
			e, err := leaseOf(t, c).NewElection("leader", lease.ElectionOptions{Holder: who, TTL: ttl})
			if err != nil {
				errs <- err
				return
			}
			for range terms {
				errs <- func() error {
					lead, err := e.Campaign(ctx, "http://"+who)
					if err != nil {
						return err
					}
					defer lead.Resign(ctx)
					cur, err := observer.Leader(ctx)
					if err != nil {
						return err
					}
					if cur.Token != lead.Token() || cur.Holder != who || cur.Payload != "http://"+who {
						return fmt.Errorf("%s leads with token %d, Leader says %s with %d (%q)", who, lead.Token(), cur.Holder, cur.Token, cur.Payload)
					}
					if _, err := fenceOf(t, c).WriteRow(lead.Context(), fence.WriteRowRequest{
						Resource: "leader", Key: "config", Value: who, Token: lead.Token(), Lease: "leader",
					}); err != nil {
						return err
					}
					if err := section(lead.Context(), pool, who, lead.Token(), 10*time.Millisecond); err != nil {
						return err
					}
					if err := lead.Resign(ctx); err != nil {
						return err
					}
					if lead.Context().Err() == nil {
						return errors.New("the term's context still runs after Resign")
					}
					return nil
				}()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	var runs, maxActive, overlaps, terms2 int
	require.NoError(t, pool.QueryRow(ctx, `SELECT runs, max_active FROM running`).Scan(&runs, &maxActive))
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FROM run_log a JOIN run_log b ON a.id < b.id
		WHERE a.started < b.stopped AND b.started < a.stopped`).Scan(&overlaps))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT token) FROM run_log`).Scan(&terms2))
	require.Equal(t, 3*terms, runs)
	require.Equal(t, 1, maxActive, "exactly one leader at a time")
	require.Zero(t, overlaps)
	require.Equal(t, 3*terms, terms2, "each term has its own token")

	// Resign hands over at once: the next term starts well within the TTL
	// after the previous one ended (a leader that merely stopped would
	// hold the others off for the whole TTL).
	var maxGap time.Duration
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT coalesce(max(gap), interval '0') FROM (
			SELECT started - lag(stopped) OVER (ORDER BY started) AS gap FROM run_log) g`).Scan(&maxGap))
	require.Less(t, maxGap, ttl/2, "resign handed over")
	t.Logf("%d terms, at most %d leader at a time, %d overlaps, longest handover %s (TTL %s)", runs, maxActive, overlaps, maxGap, ttl)

	_, err = observer.Leader(ctx)
	require.ErrorIs(t, err, lease.ErrNoLeader, "everybody resigned")
}

func TestElectionPausedLeaderLosesAndItsWritesAreRejected(t *testing.T) {
	t.Parallel()
	_, clients := replicas(t, 3)
	ctx := context.Background()
	const ttl = time.Second

	// Node A's renewals stop, as when its process is paused: its keeper
	// waits in the hook until the pause ends.
	pause := make(chan struct{})
	paused := &lease.KeepaliveOptions{}
	lease.SetBeforeRenew(paused, func(ctx context.Context) error {
		select {
		case <-pause:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	ea, err := leaseOf(t, clients[0]).NewElection("primary", lease.ElectionOptions{Holder: "a", TTL: ttl, Keepalive: paused})
	require.NoError(t, err)
	eb, err := leaseOf(t, clients[1]).NewElection("primary", lease.ElectionOptions{Holder: "b", TTL: ttl})
	require.NoError(t, err)
	ec, err := leaseOf(t, clients[2]).NewElection("primary", lease.ElectionOptions{Holder: "c", TTL: ttl})
	require.NoError(t, err)

	octx, stopObserving := context.WithCancel(ctx)
	var omu sync.Mutex
	var seen []string // the values of the held leases the observer saw
	observed := make(chan struct{})
	go func() {
		defer close(observed)
		for l := range ec.Observe(octx, 10*time.Millisecond) {
			if l.Held {
				omu.Lock()
				seen = append(seen, l.Payload)
				omu.Unlock()
			}
		}
	}()

	a, err := ea.Campaign(ctx, "a:5432")
	require.NoError(t, err)
	_, err = fenceOf(t, clients[0]).WriteRow(ctx, fence.WriteRowRequest{Resource: "primary", Key: "k", Value: "a", Token: a.Token(), Lease: "primary"})
	require.NoError(t, err)

	bDone := make(chan *lease.Leadership, 1)
	go func() {
		b, err := eb.Campaign(ctx, "b:5432")
		if err != nil {
			t.Error(err)
		}
		bDone <- b
	}()

	// A loses leadership before its lease expires by the database clock.
	select {
	case <-a.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the paused leader's term did not end")
	}
	require.ErrorIs(t, context.Cause(a.Context()), lease.ErrExpiring)

	var b *lease.Leadership
	select {
	case b = <-bDone:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not become leader after a's lease expired")
	}
	require.NotNil(t, b)
	defer b.Resign(ctx)
	require.Greater(t, b.Token(), a.Token())
	require.Less(t, a.Lease().ExpiresAt, b.Lease().AcquiredAt.Add(time.Nanosecond), "b took over only after a's lease expired")

	// A wakes up and, not having looked at its context, writes as leader:
	// rejected whether or not the write names the lease.
	close(pause)
	_, err = fenceOf(t, clients[0]).WriteRow(ctx, fence.WriteRowRequest{Resource: "primary", Key: "k", Value: "a late", Token: a.Token(), Lease: "primary"})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	_, err = fenceOf(t, clients[0]).WriteRow(ctx, fence.WriteRowRequest{Resource: "primary", Key: "k", Value: "a late", Token: a.Token()})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	require.ErrorIs(t, a.Proclaim(ctx, "a again"), lease.ErrLost)
	require.NoError(t, a.Resign(ctx), "resigning a lost term is not an error")

	row, err := fenceOf(t, clients[1]).WriteRow(ctx, fence.WriteRowRequest{Resource: "primary", Key: "k", Value: "b", Token: b.Token(), Lease: "primary"})
	require.NoError(t, err)
	require.Equal(t, b.Token(), row.Token)

	lastSeen := func(v string) func() bool {
		return func() bool {
			omu.Lock()
			defer omu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] == v
		}
	}
	require.Eventually(t, lastSeen("b:5432"), 3*time.Second, 5*time.Millisecond, "the observer sees the new leader")
	require.NoError(t, b.Proclaim(ctx, "b:6432"))
	cur, err := ec.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "b", cur.Holder)
	require.Equal(t, b.Token(), cur.Token)
	require.Equal(t, "b:6432", cur.Payload)

	// The observer saw a, then b, then b's new value, in that order.
	want := []string{"a:5432", "b:5432", "b:6432"}
	require.Eventually(t, lastSeen("b:6432"), 3*time.Second, 5*time.Millisecond)
	stopObserving()
	<-observed
	require.Equal(t, want, seen)
}

func TestElectionRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	for _, tc := range []struct {
		name  string
		opts  lease.ElectionOptions
		field string
	}{
		{"", lease.ElectionOptions{TTL: time.Second}, "lease name"},
		{"e", lease.ElectionOptions{}, "ttl"},
		{"e", lease.ElectionOptions{TTL: -time.Second}, "ttl"},
		{"e", lease.ElectionOptions{TTL: time.Second, Keepalive: &lease.KeepaliveOptions{Margin: -1}}, "margin"},
	} {
		_, err := b.leases.NewElection(tc.name, tc.opts)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, tc.field, ie.Field)
	}
	e, err := b.leases.NewElection("e", lease.ElectionOptions{TTL: time.Second})
	require.NoError(t, err)
	_, err = e.Campaign(b.ctx, "bad\x00value")
	var ie *quota.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "payload", ie.Field)
	_, err = e.Leader(b.ctx)
	require.ErrorIs(t, err, lease.ErrNoLeader)
	var rows int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.lease`).Scan(&rows))
	require.Zero(t, rows, "nothing written")
}

func TestElectionTermOutlivesCampaignContext(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	e, err := b.leases.NewElection("term", lease.ElectionOptions{TTL: 600 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	lead, err := e.Campaign(ctx, "")
	require.NoError(t, err)
	cancel() // the wait is over; the term goes on

	time.Sleep(time.Second) // past the TTL: renewals keep the term
	require.NoError(t, lead.Context().Err())
	cur, err := e.Leader(b.ctx)
	require.NoError(t, err)
	require.Equal(t, lead.Token(), cur.Token)
	l, ok := lease.FromContext(lead.Context())
	require.True(t, ok)
	require.Equal(t, lead.Token(), l.Token)

	require.NoError(t, lead.Resign(b.ctx))
	require.ErrorIs(t, context.Cause(lead.Context()), lease.ErrKeepaliveStopped)
	<-lead.Done()
	_, err = e.Leader(b.ctx)
	require.ErrorIs(t, err, lease.ErrNoLeader)
}
