package fence_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// A guarded table is bound to the lease named like its resource: holder A
// holds it; a token of any other lease x (larger, since one sequence serves
// every lease) is refused with PQ004 (ErrWrongLease) through
// present_token, PresentTokenTx and WriteFencedRow naming x, moves no mark,
// and A keeps writing. A fenced write naming no lease is checked against
// the bound lease.
func TestGuardRefusesAnotherLeasesToken(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	require.Equal(t, g.Resource, g.Lease, "bound by default to the lease named like the resource")
	a := b.acquire(t, g.Resource, "A", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, a.Token, `INSERT INTO reports VALUES (1, 'a', NULL)`))
	x := b.acquire(t, "x", "X", time.Minute)
	require.Greater(t, x.Token, a.Token)

	// In SQL, as the issue ran it.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `SELECT pgquota.present_token('public.reports', $1, 'x')`, x.Token)
	pgErr := requireSQLState(t, err, fence.SQLStateWrongLease)
	require.Equal(t, fmt.Sprintf("pgquota: resource public.reports is bound to lease public.reports: token %d of lease x refused", x.Token), pgErr.Message)
	require.JSONEq(t, fmt.Sprintf(`{"resource": "public.reports", "lease": "x", "token": %d, "bound": "public.reports", "binding": "lease"}`, x.Token), pgErr.Detail)
	require.NoError(t, tx.Rollback(b.ctx))

	// PresentTokenTx.
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	err = b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: x.Token, Lease: "x"})
	require.ErrorIs(t, err, fence.ErrWrongLease)
	requireSQLState(t, err, fence.SQLStateWrongLease)
	require.NoError(t, tx.Rollback(b.ctx))

	// WriteFencedRow on the table's resource, naming x, and naming none.
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: g.Resource, Key: "k", Value: "x", Token: x.Token, Lease: "x"})
	require.ErrorIs(t, err, fence.ErrWrongLease)
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: g.Resource, Key: "k", Value: "x", Token: x.Token})
	require.ErrorIs(t, err, lease.ErrLost, "no lease named: checked against the bound lease, which x's token does not hold")

	f, err := b.fences.State(b.ctx, g.Resource)
	require.NoError(t, err)
	require.Equal(t, a.Token, f.Highest, "no refused token moved the mark")
	require.NoError(t, b.txWith(t, g.Resource, a.Token, `UPDATE reports SET val = 'a2'`), "A is not locked out")
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: g.Resource, Key: "k", Value: "a", Token: a.Token})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("1:a2:%d", a.Token), b.rowsOf(t, "reports"))

	// Bound to a lease named otherwise: that lease's token writes, the one
	// named like the resource does not.
	b.appDDL(t, `CREATE TABLE public.jobs (id int PRIMARY KEY, val text, tok bigint)`, nil, "public.jobs")
	gj, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "public.jobs", Column: "tok", Lease: "nightly"})
	require.NoError(t, err)
	require.Equal(t, "nightly", gj.Lease)
	n := b.acquire(t, "nightly", "N", time.Minute)
	own := b.acquire(t, gj.Resource, "J", time.Minute)
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	require.NoError(t, b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: gj.Resource, Token: n.Token}),
		"acquiring the lease named like the resource raised no mark of a table bound to another lease")
	_, err = tx.Exec(b.ctx, `INSERT INTO jobs VALUES (1, 'n', NULL)`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	err = b.txWith(t, gj.Resource, own.Token, `UPDATE jobs SET val = 'own'`)
	require.ErrorIs(t, err, lease.ErrLost, "presented without a lease: checked against nightly, which own's token does not hold")
	require.Equal(t, fmt.Sprintf("1:n:%d", n.Token), b.rowsOf(t, "jobs"))
}

// A holder refused with its own token (deposed) cannot come back through a
// scratch lease of its own.
func TestGuardDeposedHolderCannotWriteWithScratchLease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	a := b.acquire(t, g.Resource, "A", 200*time.Millisecond)
	require.NoError(t, b.txWith(t, g.Resource, a.Token, `INSERT INTO reports VALUES (1, 'a', NULL)`))
	time.Sleep(300 * time.Millisecond)
	bl := b.acquire(t, g.Resource, "B", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, bl.Token, `UPDATE reports SET val = 'b'`))
	require.ErrorIs(t, b.txWith(t, g.Resource, a.Token, `UPDATE reports SET val = 'a stale'`), fence.ErrStaleToken)

	scratch := b.acquire(t, "scratch", "A", time.Minute)
	require.Greater(t, scratch.Token, bl.Token)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	err = b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: scratch.Token, Lease: "scratch"})
	require.ErrorIs(t, err, fence.ErrWrongLease)
	require.NoError(t, tx.Rollback(b.ctx))
	require.Equal(t, fmt.Sprintf("1:b:%d", bl.Token), b.rowsOf(t, "reports"))
	require.NoError(t, b.txWith(t, g.Resource, bl.Token, `UPDATE reports SET val = 'b2'`), "B is not locked out")
}

// A table bound to a semaphore: three current slot holders write it in
// turn, again and again, none locking another out; a slot that expired is
// refused (PQ002), one taken over since is refused (PQ001), and a token of
// a lease that is no slot of the semaphore is refused (PQ004).
func TestGuardSemaphoreEveryCurrentHolderWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.appDDL(t, `CREATE TABLE public.work (id int PRIMARY KEY, val text, tok bigint)`, nil, "public.work")
	g, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "public.work", Column: "tok", Semaphore: "pool"})
	require.NoError(t, err)
	require.Equal(t, "pool", g.Semaphore)
	require.Empty(t, g.Lease)

	slot := func(holder string, ttl time.Duration) lease.Slot {
		s, err := b.leases.AcquireSlot(b.ctx, lease.SlotRequest{Semaphore: "pool", Limit: 3, Holder: holder, TTL: ttl})
		require.NoError(t, err)
		return s
	}
	write := func(s lease.Slot, leaseName string, id int) error {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		if err := b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: s.Token, Lease: leaseName}); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO work VALUES ($1, $2, NULL) ON CONFLICT (id) DO UPDATE SET val = excluded.val`, id, s.Holder); err != nil {
			return err
		}
		return tx.Commit(b.ctx)
	}
	s1, s2 := slot("one", time.Minute), slot("two", time.Minute)
	s3 := slot("three", 300*time.Millisecond)
	for round := 0; round < 3; round++ {
		// Newest first: with one mark for the resource, the newest would
		// lock the others out.
		for i, s := range []lease.Slot{s3, s2, s1} {
			leaseName := s.Name
			if round == 1 {
				leaseName = "" // the slot holding the token is found
			}
			require.NoError(t, write(s, leaseName, i+1), "round %d, %s", round, s.Holder)
		}
	}
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: g.Resource, Key: "k", Value: "one", Token: s1.Token, Lease: s1.Name})
	require.NoError(t, err, "a fenced row of the resource, by a slot holder")
	require.Equal(t, fmt.Sprintf("1:three:%d,2:two:%d,3:one:%d", s3.Token, s2.Token, s1.Token), b.rowsOf(t, "work"))

	time.Sleep(400 * time.Millisecond) // slot three expires
	require.ErrorIs(t, write(s3, s3.Name, 1), lease.ErrLost)
	s4 := slot("four", time.Minute) // takes slot three's place
	require.Equal(t, s3.Name, s4.Name)
	err = write(s3, s3.Name, 1)
	require.ErrorIs(t, err, fence.ErrStaleToken, "taken over since")
	require.ErrorIs(t, write(s3, "", 1), fence.ErrWrongLease, "no current slot holds the token")
	require.NoError(t, write(s4, s4.Name, 1))
	require.NoError(t, write(s1, s1.Name, 3), "an older holder still writes after a newer one")

	x := b.acquire(t, "x", "X", time.Minute)
	err = write(lease.Slot{Lease: x}, "x", 2)
	require.ErrorIs(t, err, fence.ErrWrongLease)
	requireSQLState(t, err, fence.SQLStateWrongLease)
	require.Equal(t, fmt.Sprintf("1:four:%d,2:two:%d,3:one:%d", s4.Token, s2.Token, s1.Token), b.rowsOf(t, "work"))
}
