package quota_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// The transaction setting that present_token fills is only a record: a
// session can set it by hand. On a lease-backed guarded table such a token
// still needs its lease held with it, by the database clock, at each
// statement: after the holder released (or its lease expired), a token set
// by hand equal to the highest seen is refused with PQ002; token 0 on a
// table nobody wrote yet is refused with PQ003; and a lease that expires
// inside a transaction that presented its token admits no later statement.
func TestFenceGuardHandSetTokenNeedsHeldLease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	fresh := b.guardReports(t, "fresh", false)

	h := b.acquire(t, g.Resource, "holder", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h.Token, `INSERT INTO reports VALUES (1, 'held', NULL)`))
	// While the lease is held the holder's own token, set by hand, is the
	// holder's write (nobody but the holder should know it is current).
	require.NoError(t, b.forgedTx(t, g.Resource, h.Token, `UPDATE reports SET val = 'by hand while held' WHERE id = 1`))
	_, err := b.client.Release(b.ctx, g.Resource, h.Token)
	require.NoError(t, err)

	for _, stmt := range []string{
		`UPDATE reports SET val = 'after release' WHERE id = 1`,
		`INSERT INTO reports VALUES (9, 'after release', NULL)`,
		`DELETE FROM reports WHERE id = 1`,
		`TRUNCATE reports`,
	} {
		err := b.forgedTx(t, g.Resource, h.Token, stmt)
		requireSQLState(t, err, quota.SQLStateLeaseNotHeld, stmt)
		require.ErrorIs(t, quota.FenceError(err), quota.ErrLeaseLost, stmt)
	}
	require.Equal(t, fmt.Sprintf("1:by hand while held:%d", h.Token), b.rowsOf(t, "reports"))

	for _, stmt := range []string{`INSERT INTO fresh VALUES (1, 'zero', NULL)`, `TRUNCATE fresh`} {
		err := b.forgedTx(t, fresh.Resource, 0, stmt)
		requireSQLState(t, err, quota.SQLStateTokenNotPresented, stmt)
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
	requireSQLState(t, err, quota.SQLStateLeaseNotHeld)
}
