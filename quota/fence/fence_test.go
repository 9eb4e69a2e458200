package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/fencedgrant"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// requireStale checks that err is a *StaleTokenError with these tokens.
func requireStale(t *testing.T, err error, resource string, token, highest int64) {
	t.Helper()
	require.ErrorIs(t, err, fence.ErrStaleToken)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, resource, se.Resource)
	require.Equal(t, token, se.Token)
	require.Equal(t, highest, se.Highest)
	require.ErrorContains(t, err, fmt.Sprintf("stale fencing token %d", token))
}

// The background article's timeline (client 1 paused with token 33, client
// 2 wrote with 34), with the lease in the same database.
func TestFenceArticleTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const ttl = 300 * time.Millisecond

	h1 := b.acquire(t, "storage", "client-1", ttl)
	_, err := b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "storage", Key: "file", Value: "v1", Token: h1.Token, Lease: "storage"})
	require.NoError(t, err)

	// Client 1 pauses (a GC pause) past its TTL.
	time.Sleep(ttl + 100*time.Millisecond)

	// Client 2 acquires with a larger token and writes.
	h2 := b.acquire(t, "storage", "client-2", time.Minute)
	require.Greater(t, h2.Token, h1.Token)
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "storage", Key: "file", Value: "v2", Token: h2.Token, Lease: "storage"})
	require.NoError(t, err)

	// Client 1 wakes up and writes: rejected, on the key client 2 wrote...
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "storage", Key: "file", Value: "stale", Token: h1.Token, Lease: "storage"})
	requireStale(t, err, "storage", h1.Token, h2.Token)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the SQLSTATE stays in the chain")
	require.Equal(t, fence.SQLStateStaleToken, pgErr.Code)
	// ...and on a key client 2 has not touched.
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "storage", Key: "other", Value: "stale", Token: h1.Token, Lease: "storage"})
	requireStale(t, err, "storage", h1.Token, h2.Token)
	// The same without the lease check (the fence alone rejects it too).
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "storage", Key: "third", Value: "stale", Token: h1.Token})
	requireStale(t, err, "storage", h1.Token, h2.Token)

	// Client 1's renew and release fail and leave client 2's lease intact.
	_, err = b.leases.Renew(b.ctx, lease.Lease{Name: "storage", Token: h1.Token}, time.Minute)
	require.ErrorIs(t, err, lease.ErrLost)
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "storage", Token: h1.Token})
	require.ErrorIs(t, err, lease.ErrLost)
	got, err := b.leases.Get(b.ctx, "storage")
	require.NoError(t, err)
	require.Equal(t, h2.Token, got.Token)
	require.Equal(t, "client-2", got.Holder)
	require.True(t, got.Held)
	require.True(t, got.ExpiresAt.Equal(h2.ExpiresAt))

	rows, err := b.fences.Rows(b.ctx, "storage")
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "v2", rows[0].Value)
	require.Equal(t, h2.Token, rows[0].Token)
	st, err := b.fences.State(b.ctx, "storage")
	require.NoError(t, err)
	require.Equal(t, h2.Token, st.Highest)
}

// A holder whose lease lapsed is fenced off even before anyone else takes
// the lease over (the write checks the lease row), and once someone has,
// before that holder's first write (the lease token counts as seen).
func TestFenceLeaseCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	h1 := b.acquire(t, "r", "one", 200*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	_, err := b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "r", Key: "k", Value: "x", Token: h1.Token, Lease: "r"})
	require.ErrorIs(t, err, lease.ErrLost)
	require.NotErrorIs(t, err, fence.ErrStaleToken)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, fence.SQLStateLeaseNotHeld, pgErr.Code)
	// The server's message, said once.
	require.Equal(t, "pgquota: lease lost: lease r is not held with token "+strconv.FormatInt(h1.Token, 10)+
		" (expired, released or never acquired with it) (SQLSTATE PQ002)", err.Error())

	h2 := b.acquire(t, "r", "two", time.Minute)
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "r", Key: "k", Value: "x", Token: h1.Token, Lease: "r"})
	requireStale(t, err, "r", h1.Token, h2.Token)

	// A write to another resource, checked against lease r: its error
	// names the lease and the token r was acquired with since, not a
	// highest token the resource never saw.
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "other", Key: "k", Value: "x", Token: h1.Token, Lease: "r"})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	require.Equal(t, fmt.Sprintf("pgquota: stale fencing token %d for resource other: lease r was acquired since with token %d", h1.Token, h2.Token), err.Error())
	f, err := b.fences.State(b.ctx, "other")
	require.NoError(t, err)
	require.Zero(t, f.Highest, "the rejected write raised nothing")

	// A lease that was never acquired.
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "r", Key: "k", Value: "x", Token: h2.Token, Lease: "nope"})
	require.ErrorIs(t, err, lease.ErrLost)
	require.Zero(t, b.countRows(t, "fenced_row"))
}

// Equal tokens are admitted (the holder writes as often as it likes);
// tokens from an external lock service work the same way.
func TestFenceEqualAndExternalTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	// An etcd revision, say.
	for i, tok := range []int64{1000, 1000, 1001, 1001, 5000} {
		row, err := b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "etcd", Key: "k", Value: fmt.Sprint(i), Token: tok})
		require.NoError(t, err, "write %d", i)
		require.Equal(t, tok, row.Token)
	}
	_, err := b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "etcd", Key: "new", Value: "x", Token: 4999})
	requireStale(t, err, "etcd", 4999, 5000)
	// Resources are independent.
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "zk", Key: "k", Value: "x", Token: 1})
	require.NoError(t, err)
	row, err := b.fences.Row(b.ctx, "etcd", "k")
	require.NoError(t, err)
	require.Equal(t, "4", row.Value)
	_, err = b.fences.Row(b.ctx, "etcd", "new")
	require.ErrorIs(t, err, fence.ErrRowNotFound)

	// Bad input is rejected before any write.
	for _, req := range []fence.WriteRowRequest{
		{Resource: "", Key: "k", Token: 1},
		{Resource: "r", Key: "", Token: 1},
		{Resource: "r", Key: "k", Token: 0},
		{Resource: "r", Key: "k", Token: 1, Value: "a\x00b"},
		{Resource: "r", Key: "k", Token: 1, Value: "\xff"},
	} {
		_, err := b.fences.WriteRow(b.ctx, req)
		require.ErrorIs(t, err, quota.ErrInvalidInput, "%+v", req)
	}
}

// A fenced write holds the lease row FOR SHARE until its transaction ends,
// so a takeover cannot slip in between the lease check and the write: the
// acquire waits, and then sees the lease as it is after the write.
func TestFenceStealCannotSlipIn(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	h1 := b.acquire(t, "r", "one", 300*time.Millisecond)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = b.fences.WriteRowTx(b.ctx, tx, fence.WriteRowRequest{Resource: "r", Key: "k", Value: "one", Token: h1.Token, Lease: "r"})
	require.NoError(t, err)

	time.Sleep(400 * time.Millisecond) // the lease has expired by now
	acquired := make(chan lease.Lease, 1)
	go func() {
		l, err := b.leases.AcquireWait(b.ctx, lease.AcquireRequest{Name: "r", Holder: "two", TTL: time.Minute}, &lease.WaitOptions{NoListen: true})
		if err == nil {
			acquired <- l
		}
		close(acquired)
	}()
	select {
	case <-acquired:
		t.Fatal("the lease was taken over while a fenced write under it was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(b.ctx))
	h2, ok := <-acquired
	require.True(t, ok)
	require.Greater(t, h2.Token, h1.Token)
	row, err := b.fences.Row(b.ctx, "r", "k")
	require.NoError(t, err)
	require.Equal(t, "one", row.Value, "the write committed before the takeover")
}

// The guard rejects stale writes to an application's own table, also from
// plain SQL that bypasses pgquota, on rows the new holder wrote and on rows
// it did not touch.
func TestFenceGuardTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	// DDL on purpose, as the owner: the application's table and its guard.
	b.appDDL(t, `
		CREATE SCHEMA app;
		CREATE TABLE app."Orders" (id int PRIMARY KEY, status text, fence_token bigint)`, []string{"app"}, `app."Orders"`)
	owner := b.ownerClient(t)
	g, err := fenceOf(t, owner).GuardTable(b.ctx, fence.GuardTableRequest{Table: `app."Orders"`, Column: "fence_token"})
	require.NoError(t, err)
	require.Equal(t, `"app"."Orders"`, g.Table)
	require.Equal(t, `app."Orders"`, g.Resource)
	require.Equal(t, fence.GuardTrigger, g.Trigger)
	require.Equal(t, fence.GuardTruncateTrigger, g.TruncateTrigger)
	// Attaching again is harmless.
	_, err = fenceOf(t, owner).GuardTable(b.ctx, fence.GuardTableRequest{Table: `app."Orders"`, Column: "fence_token"})
	require.NoError(t, err)

	h1 := b.acquire(t, g.Resource, "one", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h1.Token, `INSERT INTO app."Orders" VALUES (1, 'new', NULL), (2, 'new', NULL)`))
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: h1.Token})
	require.NoError(t, err)
	h2 := b.acquire(t, g.Resource, "two", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h2.Token, `UPDATE app."Orders" SET status = 'paid' WHERE id = 1`))

	// The stale holder's raw UPDATE, on the row the new holder wrote and on
	// one it did not touch, with its token in the row as before.
	for _, id := range []int{1, 2} {
		stmt := fmt.Sprintf(`UPDATE app."Orders" SET status = 'cancelled', fence_token = %d WHERE id = %d`, h1.Token, id)
		// Its token set by hand in the guard's setting: no proof of
		// presentation, refused as not presented.
		err = b.forgedTx(t, g.Resource, h1.Token, stmt)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, fence.SQLStateTokenNotPresented, pgErr.Code)
		require.Contains(t, pgErr.Message, fmt.Sprintf("fencing token %d for resource", h1.Token))
		require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented)
		err = b.txWith(t, g.Resource, h1.Token, stmt)
		requireStale(t, err, g.Resource, h1.Token, h2.Token)
	}
	// A write without a token is rejected too.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO app."Orders" (id, status) VALUES (3, 'new')`)
	require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented)
	var status string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT string_agg(status || ':' || fence_token, ',' ORDER BY id) FROM app."Orders"`).Scan(&status))
	require.Equal(t, fmt.Sprintf("paid:%d,new:%d", h2.Token, h1.Token), status)

	// MapFenceError leaves other errors alone.
	other := errors.New("x")
	require.Same(t, other, fence.MapError(other))

	_, err = fenceOf(t, owner).GuardTable(b.ctx, fence.GuardTableRequest{Table: "app.nope", Column: "fence_token"})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	_, err = fenceOf(t, owner).GuardTable(b.ctx, fence.GuardTableRequest{Table: `app."Orders"`, Column: "nope"})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	_, err = fenceOf(t, owner).GuardTable(b.ctx, fence.GuardTableRequest{Table: `app."Orders"`, Column: "status"})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
}

// The fenced-lock grant is exact under the foundation's invariants: first
// grants of a window racing, amounts above 1, limit 0.
func TestGrantFencedConcurrent(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		limit   int64
		amounts func(i int) int64
		full    bool // exactly the limit must be granted
	}{
		{"amount 1, limit 20", 20, func(int) int64 { return 1 }, true},
		{"amount 1, limit 1", 1, func(int) int64 { return 1 }, true},
		{"amounts 1..7, limit 50", 50, func(i int) int64 { return int64(i%7 + 1) }, false},
		{"limit 0", 0, func(int) int64 { return 1 }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const callers = 32
			b := setup(t, 12)
			b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(tc.limit)})
			results := make([]quota.GrantResult, callers)
			errs := make([]error, callers)
			concurrently(callers, func(i int) {
				results[i], errs[i] = grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: tc.amounts(i)}, 5*time.Second)
			})
			var units, calls int64
			for i, r := range results {
				require.NoError(t, errs[i])
				if r.Granted {
					units += r.Amount
					calls++
				} else {
					require.Greater(t, r.Used+r.Amount, r.Limit, "a denial must be consistent with the usage it reports")
				}
			}
			sum, rows := b.usageRows(t, "q", "m")
			require.Equal(t, units, sum, "counter equals the units reported granted")
			require.LessOrEqual(t, sum, tc.limit)
			if tc.limit == 0 {
				require.Zero(t, rows)
				return
			}
			require.Equal(t, int64(1), rows)
			if tc.full {
				require.Equal(t, tc.limit, calls)
			} else {
				for _, r := range results {
					if !r.Granted {
						require.Greater(t, sum+r.Amount, tc.limit)
					}
				}
			}
		})
	}
}

func TestGrantFencedErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay})
	_, err := grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1}, 0)
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
	_, err = grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 0}, 0)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	_, err = grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, 0)
	require.ErrorIs(t, err, quota.ErrNoLimit)
	_, err = grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: ptr[int64](1)}, 30)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	res, err := grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2, Limit: ptr[int64](3)}, 0)
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, int64(2), res.Used)
	require.Equal(t, int64(1), res.Remaining)
	// The lease is released after each grant.
	l, err := b.leases.Get(b.ctx, fencedgrant.LeaseName("q", "m"))
	require.NoError(t, err)
	require.False(t, l.Held)
}

// Pauses longer than the TTL between the read and the write: the paused
// caller's write is fenced off, it starts over, and the counter stays
// exact.
func TestGrantFencedPausePastTTL(t *testing.T) {
	t.Parallel()
	const (
		callers = 16
		limit   = 10
		ttl     = 150 * time.Millisecond
	)
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})
	var paused atomic.Int64
	setFencedGrantPause(b.client, func(ctx context.Context, l lease.Lease) {
		// Every third write pauses past its lease.
		if paused.Add(1)%3 == 1 {
			time.Sleep(2 * ttl)
		}
	})
	var mu sync.Mutex
	granted := 0
	var firstErr error
	concurrently(callers, func(i int) {
		r, err := grantFenced(b.ctx, b.client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, ttl)
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if r.Granted {
			granted++
		}
	})
	require.NoError(t, firstErr)
	require.Equal(t, limit, granted)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(limit), sum)
	require.Greater(t, paused.Load(), int64(limit), "paused writes were fenced off and retried")
}
