package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
)

// pgx's default exec mode (cache_statement) prepares each statement once
// per connection. After ALTER COLUMN ... TYPE on a pgquota table the
// server refuses to run such a statement ("cached plan must not change
// result type", SQLSTATE 0A000): the outbox listing and the relay's claim
// used to fail once on every pooled connection that had run them. They are
// now retried once after the statement caches were reset. Each connection
// of the pool is used in turn (the others held), so every one had the
// statements cached before the change.
//
// Each of the two calls runs first after the change in one subtest, since
// a reset made for one clears the other's statement too.
func TestCachedPlanRetriedAfterColumnTypeChange(t *testing.T) {
	t.Parallel()
	for _, claimFirst := range []bool{false, true} {
		name := "outbox listing first"
		if claimFirst {
			name = "relay claim first"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cachedPlanRetried(t, claimFirst)
		})
	}
}

func cachedPlanRetried(t *testing.T, claimFirst bool) {
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	const conns = 3
	pool := pgtest.Connect(t, dbURL, conns) // direct, pgx's default mode
	require.Equal(t, pgx.QueryExecModeCacheStatement, pool.Config().ConnConfig.DefaultQueryExecMode)
	c, err := quota.New(pool, nil)
	require.NoError(t, err)
	// The relay's client: c in the normal pass, so that the enqueue, the
	// listing and the claim share the held connection; under
	// PGQUOTA_TEST_APP_ROLE=1 a pool of as many connections as the relay's
	// role, on which the listing and the claim run (the enqueue is the
	// application's).
	rc := relayWith(t, c, nil, conns)
	rpool := rc.Pool()
	require.Equal(t, pgx.QueryExecModeCacheStatement, rpool.Config().ConnConfig.DefaultQueryExecMode)
	delivered := 0
	relay, err := outboxOf(t, rc).NewRelay(func(context.Context, outbox.Event) error { delivered++; return nil }, outbox.RelayConfig{})
	require.NoError(t, err)

	held := make([]*pgxpool.Conn, conns)
	for i := range held {
		held[i], err = rpool.Acquire(ctx)
		require.NoError(t, err)
	}
	releaseAll := func() {
		for _, h := range held {
			h.Release()
		}
	}
	defer releaseAll()
	// onConn runs fn while every connection but the i-th is held, so fn's
	// calls run on that one.
	onConn := func(i int, fn func()) {
		held[i].Release()
		fn()
		held[i], err = rpool.Acquire(ctx)
		require.NoError(t, err)
	}
	round := func(i int) {
		_, err := outboxOf(t, c).Enqueue(ctx, "t", []byte("x"), nil)
		require.NoError(t, err)
		list := func() {
			evs, err := outboxOf(t, rc).Events(ctx, outbox.Filter{})
			require.NoError(t, err, "connection %d: outbox listing", i)
			require.NotEmpty(t, evs)
		}
		claim := func() {
			res, err := relay.RunOnce(ctx)
			require.NoError(t, err, "connection %d: relay claim", i)
			require.Equal(t, 1, res.Delivered)
		}
		if claimFirst {
			claim()
			list()
		} else {
			list()
			claim()
		}
	}
	for i := range conns {
		onConn(i, func() { round(i) })
	}

	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `ALTER TABLE pgquota.outbox ALTER COLUMN attempts TYPE bigint`)
	require.NoError(t, err)

	for i := range conns {
		onConn(i, func() { round(i) })
	}
	require.Equal(t, 2*conns, delivered)
	releaseAll()
	evs, err := outboxOf(t, c).Events(ctx, outbox.Filter{State: outbox.StateDelivered})
	require.NoError(t, err)
	require.Len(t, evs, 2*conns)
}

// A server connection whose prepared statements were dropped behind pgx's
// back (DEALLOCATE ALL, or DISCARD ALL run by a pooler's reset query) made
// the next call fail with 26000 ("prepared statement ... does not exist");
// it is retried once after the statement caches were reset.
func TestCachedStatementRetriedAfterDeallocate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Connect(t, pgtest.NewURL(t), 1) // direct, pgx's default mode
	c, err := quota.New(pool, nil)
	require.NoError(t, err)
	_, err = outboxOf(t, c).Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	l, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: "r", Holder: "h", TTL: time.Minute})
	require.NoError(t, err)
	_, err = outboxOf(t, c).Events(ctx, outbox.Filter{})
	require.NoError(t, err)

	_, err = pool.Exec(ctx, "DEALLOCATE ALL") // no arguments: pgx runs it as a simple query and caches nothing
	require.NoError(t, err)
	evs, err := outboxOf(t, c).Events(ctx, outbox.Filter{})
	require.NoError(t, err, "outbox listing")
	require.Len(t, evs, 1)

	_, err = pool.Exec(ctx, "DEALLOCATE ALL")
	require.NoError(t, err)
	_, err = leaseOf(t, c).Renew(ctx, lease.Lease{Name: "r", Token: l.Token}, time.Minute)
	require.NoError(t, err, "renew")

	_, err = pool.Exec(ctx, "DEALLOCATE ALL")
	require.NoError(t, err)
	got, err := leaseOf(t, c).Get(ctx, "r")
	require.NoError(t, err, "lease read")
	require.Equal(t, l.Token, got.Token)
}
