package fence_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// The transaction setting that present_token fills can be set by hand, but
// a token set there carries no proof of presentation (a keyed hash over
// resource, token, lease and the transaction's id that only present_token
// computes): it is refused with PQ003 even while the holder holds its
// lease, as after the holder released, and so is token 0 on a table nobody
// wrote yet; and a lease that expires inside a transaction that presented
// its token admits no later statement (PQ002).
func TestFenceGuardHandSetTokenNeedsHeldLease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	fresh := b.guardReports(t, "fresh", false)

	h := b.acquire(t, g.Resource, "holder", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h.Token, `INSERT INTO reports VALUES (1, 'held', NULL)`))
	// While the lease is held: refused all the same.
	err := b.forgedTx(t, g.Resource, h.Token, `UPDATE reports SET val = 'by hand while held' WHERE id = 1`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: h.Token})
	require.NoError(t, err)

	for _, stmt := range []string{
		`UPDATE reports SET val = 'after release' WHERE id = 1`,
		`INSERT INTO reports VALUES (9, 'after release', NULL)`,
		`DELETE FROM reports WHERE id = 1`,
		`TRUNCATE reports`,
	} {
		err := b.forgedTx(t, g.Resource, h.Token, stmt)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, stmt)
		require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented, stmt)
	}
	require.Equal(t, fmt.Sprintf("1:held:%d", h.Token), b.rowsOf(t, "reports"))

	for _, stmt := range []string{`INSERT INTO fresh VALUES (1, 'zero', NULL)`, `TRUNCATE fresh`} {
		err := b.forgedTx(t, fresh.Resource, 0, stmt)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, stmt)
	}
	require.Equal(t, "", b.rowsOf(t, "fresh"))

	// A lease that expires after its token was presented: the next
	// statement of the same transaction is refused.
	short := b.acquire(t, g.Resource, "short", 300*time.Millisecond)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `SELECT pgquota.present_token($1, $2)`, g.Resource, short.Token)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `UPDATE reports SET val = 'in time' WHERE id = 1`)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT pg_sleep(0.4)`)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `UPDATE reports SET val = 'too late' WHERE id = 1`)
	requireSQLState(t, err, fence.SQLStateLeaseNotHeld)
}

// The breaker cases of a hand-set stale token: the table is bound to a
// lease named otherwise (GuardTableRequest.Lease), so taking that lease
// over does not raise the table's own mark; and a transaction at
// REPEATABLE READ whose snapshot predates the takeover. Both are refused.
func TestFenceGuardHandSetStaleTokenAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.appDDL(t, `CREATE TABLE public.reports (id int PRIMARY KEY, val text, tok bigint)`, nil, "public.reports")
	g, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "public.reports", Column: "tok", Lease: "job"})
	require.NoError(t, err)
	require.Equal(t, "job", g.Lease)

	// A lease named otherwise.
	a := b.acquire(t, "job", "A", time.Minute)
	present := func(tok int64, stmt string) error {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		if err := b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: tok, Lease: "job"}); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, stmt); err != nil {
			return err
		}
		return tx.Commit(b.ctx)
	}
	require.NoError(t, present(a.Token, `INSERT INTO reports VALUES (1, 'a', NULL)`))
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: "job", Token: a.Token})
	require.NoError(t, err)
	bl := b.acquire(t, "job", "B", time.Minute)
	require.Greater(t, bl.Token, a.Token)
	require.Error(t, present(a.Token, `UPDATE reports SET val = 'A stale'`))
	for _, forge := range []string{
		`SELECT set_config('pgquota.fence_tokens', json_build_object('public.reports', $1::bigint)::text, true)`,
		`SELECT set_config('pgquota.fence_tokens', json_build_object('public.reports', $1::bigint)::text, true),
		        set_config('pgquota.fence_leases', '{"public.reports": "job"}', true)`,
	} {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, forge, a.Token)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, `UPDATE reports SET val = 'A stale, by hand' WHERE id = 1`)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, forge)
		require.NoError(t, tx.Rollback(b.ctx))
	}
	require.Equal(t, fmt.Sprintf("1:a:%d", a.Token), b.rowsOf(t, "reports"))

	// REPEATABLE READ: A's snapshot predates B's takeover of the lease
	// named like the resource.
	r := b.guardReports(t, "rr", false)
	ra := b.acquire(t, r.Resource, "A", time.Minute)
	require.NoError(t, b.txWith(t, r.Resource, ra.Token, `INSERT INTO rr VALUES (1, 'a', NULL), (2, 'a', NULL)`))
	stale, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = stale.Rollback(b.ctx) }()
	_, err = stale.Exec(b.ctx, `SELECT count(*) FROM rr`) // the snapshot
	require.NoError(t, err)
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: r.Resource, Token: ra.Token})
	require.NoError(t, err)
	rb := b.acquire(t, r.Resource, "B", time.Minute)
	require.NoError(t, b.txWith(t, r.Resource, rb.Token, `UPDATE rr SET val = 'b' WHERE id = 1`))
	_, err = stale.Exec(b.ctx, `SELECT set_config('pgquota.fence_tokens', json_build_object('public.rr', $1::bigint)::text, true)`, ra.Token)
	require.NoError(t, err)
	_, err = stale.Exec(b.ctx, `UPDATE rr SET val = 'A stale (snapshot)' WHERE id = 2`)
	require.Error(t, err, "A's stale write at REPEATABLE READ is refused")
	_ = stale.Rollback(b.ctx)
	require.Equal(t, fmt.Sprintf("1:b:%d,2:a:%d", rb.Token, ra.Token), b.rowsOf(t, "rr"))
}

// An external token (a write checked against no lease) above every token
// pgquota's leases issued is refused on a resource whose guarded table
// takes lease tokens: admitting it would raise the mark past every real
// holder for good. On an external guarded table it is admitted.
func TestFenceWriteInventedTokenOnLeaseBackedGuardedResource(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	h := b.acquire(t, g.Resource, "holder", time.Minute)
	_, err := b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: g.Resource, Key: "k", Value: "x", Token: 9223372036854775000})
	requireSQLState(t, err, fence.SQLStateLeaseNotHeld)
	require.ErrorIs(t, err, lease.ErrLost)
	require.NoError(t, b.txWith(t, g.Resource, h.Token, `INSERT INTO reports VALUES (1, 'holder', NULL)`), "the real holder is not locked out")

	ext := b.guardReports(t, "ext", true)
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: ext.Resource, Key: "k", Value: "x", Token: 9223372036854775000})
	require.NoError(t, err, "an external resource takes the other service's tokens")
}
