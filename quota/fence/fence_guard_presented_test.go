package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// guardReports creates table public.<name> (id, val, tok) and attaches the
// fence guard to it.
func (b *testBundle) guardReports(t *testing.T, name string, external bool) fence.GuardedTable {
	t.Helper()
	b.appDDL(t, `CREATE TABLE public.`+name+` (id int PRIMARY KEY, val text, tok bigint)`, nil, "public."+name)
	g, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "public." + name, Column: "tok", External: external})
	require.NoError(t, err)
	require.Equal(t, "public."+name, g.Resource)
	require.Equal(t, external, g.External)
	return g
}

// txWith runs stmts in one transaction, after presenting token for
// resource when token > 0, and returns the error of the first failing
// statement (the transaction is then rolled back). It may run in a
// goroutine of its own: it reports every failure as its error.
func (b *testBundle) txWith(t *testing.T, resource string, token int64, stmts ...string) error {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
	if token > 0 {
		if err := b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: resource, Token: token}); err != nil {
			return err
		}
	}
	for _, s := range stmts {
		if _, err := tx.Exec(b.ctx, s); err != nil {
			return err
		}
	}
	return tx.Commit(b.ctx)
}

// forgedTx runs stmt in a transaction whose token setting for resource was
// set by hand to token, bypassing pgquota.present_token.
func (b *testBundle) forgedTx(t *testing.T, resource string, token int64, stmt string) error {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
	_, err = tx.Exec(b.ctx, `SELECT set_config('pgquota.fence_tokens', json_build_object($1::text, $2::bigint)::text, true)`, resource, token)
	require.NoError(t, err)
	if _, err := tx.Exec(b.ctx, stmt); err != nil {
		return err
	}
	return tx.Commit(b.ctx)
}

// requireSQLState checks that err carries SQLSTATE code.
func requireSQLState(t *testing.T, err error, code string, msgAndArgs ...any) *pgconn.PgError {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, msgAndArgs...)
	require.Equal(t, code, pgErr.Code, append(msgAndArgs, pgErr.Message)...)
	return pgErr
}

// rowsOf returns "id:val:tok" for every row of a table, ordered by id.
func (b *testBundle) rowsOf(t *testing.T, table string) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT coalesce(string_agg(format('%s:%s:%s', id, val, tok), ',' ORDER BY id), '') FROM `+table).Scan(&s))
	return s
}

// The sequence: holder A (token t1) is deposed by B (token t3),
// who writes row 1. A's UPDATE leaving the token column alone, its DELETE
// and its TRUNCATE are each refused, however A comes with them: without
// presenting a token (the statement a program unaware of the guard runs),
// presenting its own stale token, or with its token set by hand in the
// setting the guard reads.
func TestFenceGuardRefusesDeposedHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)

	a := b.acquire(t, g.Resource, "A", 200*time.Millisecond)
	require.NoError(t, b.txWith(t, g.Resource, a.Token, fmt.Sprintf(`INSERT INTO reports VALUES (1, 'a', %d), (2, 'a', %d)`, a.Token, a.Token)))
	time.Sleep(400 * time.Millisecond) // A pauses past its TTL
	bl := b.acquire(t, g.Resource, "B", time.Minute)
	require.Greater(t, bl.Token, a.Token)
	require.NoError(t, b.txWith(t, g.Resource, bl.Token, fmt.Sprintf(`UPDATE reports SET val = 'b', tok = %d WHERE id = 1`, bl.Token)))
	want := fmt.Sprintf("1:b:%d,2:a:%d", bl.Token, a.Token)
	require.Equal(t, want, b.rowsOf(t, "reports"))

	for _, stmt := range []string{
		`UPDATE reports SET val = 'x' WHERE id = 1`,
		`UPDATE reports SET val = 'x' WHERE id = 2`, // a row B never wrote
		`DELETE FROM reports WHERE id = 1`,
		`TRUNCATE reports`,
		`INSERT INTO reports VALUES (3, 'x', 1)`,
	} {
		// No token presented: PQ003.
		err := b.txWith(t, g.Resource, 0, stmt)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, stmt)
		require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented, stmt)
		require.ErrorContains(t, fence.MapError(err), "no fencing token presented for resource public.reports", stmt)

		// A presents its stale token: refused at once (PQ001), nothing runs.
		err = b.txWith(t, g.Resource, a.Token, stmt)
		requireStale(t, err, g.Resource, a.Token, bl.Token)
		requireSQLState(t, err, fence.SQLStateStaleToken, stmt)

		// A's token put into the setting by hand: it carries no proof of
		// presentation, so the guard refuses it as not presented.
		err = b.forgedTx(t, g.Resource, a.Token, stmt)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, stmt)
		require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented, stmt)
	}
	require.Equal(t, want, b.rowsOf(t, "reports"), "no stale statement changed the table")

	// B's own statements still land, stamped with B's token.
	require.NoError(t, b.txWith(t, g.Resource, bl.Token, `UPDATE reports SET val = 'b2' WHERE id = 2`, `DELETE FROM reports WHERE id = 1`))
	require.Equal(t, fmt.Sprintf("2:b2:%d", bl.Token), b.rowsOf(t, "reports"))
	require.NoError(t, b.txWith(t, g.Resource, bl.Token, `TRUNCATE reports`))
	require.Empty(t, b.rowsOf(t, "reports"))
}

// A statement on a guarded table needs a token presented in its own
// transaction: one presented in an earlier transaction on the same
// connection (the next client of a pooled connection), or in a statement of
// its own outside a transaction block, does not count.
func TestFenceGuardNeedsTokenInSameTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	h := b.acquire(t, g.Resource, "holder", time.Minute)

	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: h.Token}))
	_, err = tx.Exec(b.ctx, `INSERT INTO reports VALUES (1, 'x', $1)`, h.Token)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))

	for _, stmt := range []string{
		`UPDATE reports SET val = 'y'`,
		fmt.Sprintf(`INSERT INTO reports VALUES (2, 'y', %d)`, h.Token),
		`DELETE FROM reports`,
		`TRUNCATE reports`,
	} {
		_, err = conn.Exec(b.ctx, stmt)
		pgErr := requireSQLState(t, err, fence.SQLStateTokenNotPresented, stmt)
		require.Contains(t, pgErr.Message, "SELECT pgquota.present_token('public.reports', <token>) earlier in the same transaction")
		require.Contains(t, pgErr.Detail, `"operation" : "`+strings.Fields(stmt)[0]+`"`)
	}
	// Presented in a statement outside a transaction block: gone with it.
	_, err = conn.Exec(b.ctx, `SELECT pgquota.present_token('public.reports', $1)`, h.Token)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `UPDATE reports SET val = 'y'`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	// A presentation inside a savepoint rolled back is gone too.
	tx, err = conn.Begin(b.ctx)
	require.NoError(t, err)
	sp, err := tx.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, b.fences.PresentTokenTx(b.ctx, sp, fence.PresentTokenRequest{Resource: g.Resource, Token: h.Token}))
	require.NoError(t, sp.Rollback(b.ctx))
	_, err = tx.Exec(b.ctx, `UPDATE reports SET val = 'y'`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	require.NoError(t, tx.Rollback(b.ctx))

	require.Equal(t, fmt.Sprintf("1:x:%d", h.Token), b.rowsOf(t, "reports"), "no statement without a token landed")
}

// On a lease-backed table a token no lease is held with is refused, however
// large: an invented 9e12 (above every token issued) and 0 neither land nor
// raise the resource's mark, so the real holder keeps writing.
func TestFenceGuardRefusesInventedTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	h := b.acquire(t, g.Resource, "holder", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h.Token, fmt.Sprintf(`INSERT INTO reports VALUES (1, 'real', %d)`, h.Token)))

	const invented = 9_000_000_000_000
	err := b.txWith(t, g.Resource, invented, `UPDATE reports SET val = 'invented'`)
	require.ErrorIs(t, err, lease.ErrLost)
	requireSQLState(t, err, fence.SQLStateLeaseNotHeld)
	// The same invented token written into the row, as the first form of
	// the guard accepted it.
	err = b.txWith(t, g.Resource, 0, fmt.Sprintf(`UPDATE reports SET val = 'invented', tok = %d`, int64(invented)))
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	err = b.forgedTx(t, g.Resource, invented, `UPDATE reports SET val = 'invented'`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	require.ErrorContains(t, fence.MapError(err), "was not presented with pgquota.present_token")

	// Token 0 and below: refused by the library before sending, and by the
	// database for SQL that calls present_token itself.
	for _, tok := range []int64{0, -1} {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		err = b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: tok})
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, "token", ie.Field)
		_, err = tx.Exec(b.ctx, `SELECT pgquota.present_token('public.reports', $1)`, tok)
		requireSQLState(t, err, "22023")
		require.NoError(t, tx.Rollback(b.ctx))
	}
	err = b.forgedTx(t, g.Resource, 0, `UPDATE reports SET val = 'zero'`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)

	f, err := b.fences.State(b.ctx, g.Resource)
	require.NoError(t, err)
	require.Equal(t, h.Token, f.Highest, "no refused token raised the mark")
	require.NoError(t, b.txWith(t, g.Resource, h.Token, `UPDATE reports SET val = 'real2'`))
	require.Equal(t, fmt.Sprintf("1:real2:%d", h.Token), b.rowsOf(t, "reports"), "the real holder is not locked out")

	// A token of a lease that expired without a successor, and of a lease
	// released, are refused too (PQ002).
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: h.Token})
	require.NoError(t, err)
	err = b.txWith(t, g.Resource, h.Token, `UPDATE reports SET val = 'released'`)
	require.ErrorIs(t, err, lease.ErrLost)
}

// A table fenced by an external token source (etcd revision, ZooKeeper
// zxid): no lease is checked, a higher token is admitted and raises the
// mark, a lower one is refused. Attached without External, the same tokens
// are refused: no lease holds them.
func TestFenceGuardExternalTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "zk", true)
	require.NoError(t, b.txWith(t, g.Resource, 7719, `INSERT INTO zk VALUES (1, 'first', 7719)`))
	require.NoError(t, b.txWith(t, g.Resource, 7720, `UPDATE zk SET val = 'second' WHERE id = 1`))
	require.Equal(t, "1:second:7720", b.rowsOf(t, "zk"))
	err := b.txWith(t, g.Resource, 7719, `UPDATE zk SET val = 'stale' WHERE id = 1`)
	requireStale(t, err, g.Resource, 7719, 7720)
	err = b.txWith(t, g.Resource, 0, `DELETE FROM zk`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	require.NoError(t, b.txWith(t, g.Resource, 7720, `INSERT INTO zk VALUES (2, 'again', 5)`), "an equal token is the holder writing again")
	require.Equal(t, "1:second:7720,2:again:7720", b.rowsOf(t, "zk"))

	leaseName := b.guardReports(t, "leased", false)
	err = b.txWith(t, leaseName.Resource, 7721, `INSERT INTO leased VALUES (1, 'x', NULL)`)
	require.ErrorIs(t, err, lease.ErrLost)

	// Attaching again switches the mode, and says so.
	g2, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "zk", Column: "tok"})
	require.NoError(t, err)
	require.False(t, g2.External)
	err = b.txWith(t, g.Resource, 7721, `UPDATE zk SET val = 'x'`)
	require.ErrorIs(t, err, lease.ErrLost)
}

// The presented token works beside WriteFencedRowTx in the same transaction,
// and several resources can be presented in one transaction, resource names
// that need quoting included.
func TestFenceGuardSeveralResourcesAndFenceWriteTx(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g1 := b.guardReports(t, "reports", false)
	b.appDDL(t, `CREATE SCHEMA "we'ird"; CREATE TABLE "we'ird"."Or""ders" (id int PRIMARY KEY, val text, tok bigint)`,
		[]string{`"we'ird"`}, `"we'ird"."Or""ders"`)
	g2, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: `"we'ird"."Or""ders"`, Column: "tok"})
	require.NoError(t, err)
	require.Equal(t, `"we'ird"."Or""ders"`, g2.Resource)
	h1 := b.acquire(t, g1.Resource, "one", time.Minute)
	h2 := b.acquire(t, g2.Resource, "two", time.Minute)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g1.Resource, Token: h1.Token}))
	require.NoError(t, b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g2.Resource, Token: h2.Token}))
	_, err = b.fences.WriteRowTx(b.ctx, tx, fence.WriteRowRequest{Resource: g1.Resource, Key: "k", Value: "v", Token: h1.Token, Lease: g1.Resource})
	require.NoError(t, err)
	_, err = b.fences.WriteRowTx(b.ctx, tx, fence.WriteRowRequest{Resource: "elsewhere", Key: "k", Value: "v", Token: h2.Token, Lease: g2.Resource})
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO reports VALUES (1, 'r', $1)`, h1.Token)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO "we'ird"."Or""ders" VALUES (1, 'o', $1)`, h2.Token)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, fmt.Sprintf("1:r:%d", h1.Token), b.rowsOf(t, "reports"))
	require.Equal(t, fmt.Sprintf("1:o:%d", h2.Token), b.rowsOf(t, `"we'ird"."Or""ders"`))
	row, err := b.fences.Row(b.ctx, g1.Resource, "k")
	require.NoError(t, err)
	require.Equal(t, h1.Token, row.Token)

	// Presenting one resource does not cover the other.
	err = b.txWith(t, g1.Resource, h1.Token, `UPDATE reports SET val = 'r2'`, `UPDATE "we'ird"."Or""ders" SET val = 'o2'`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	require.Contains(t, err.Error(), `UPDATE on "we'ird"."Or""ders"`)

	// A lease named otherwise than the one the table is bound to is
	// refused (PQ004), and holder one is not locked out.
	h3 := b.acquire(t, "nightly", "three", time.Minute)
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	err = b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g1.Resource, Token: h3.Token, Lease: "nightly"})
	requireSQLState(t, err, fence.SQLStateWrongLease)
	require.ErrorIs(t, err, fence.ErrWrongLease)
	require.NoError(t, tx.Rollback(b.ctx))
	require.NoError(t, b.txWith(t, g1.Resource, h1.Token, `UPDATE reports SET val = 'one'`))
	require.Equal(t, fmt.Sprintf("1:one:%d", h1.Token), b.rowsOf(t, "reports"))
}

// A transaction that presented its token keeps the lease row locked: a
// takeover attempted after the TTL waits until it ends. Its statements land
// while the lease is held by the database clock; one after the expiry is
// refused (PQ002), as a fenced write naming the lease would be.
func TestFenceGuardPresentingTransactionHoldsOffTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	a := b.acquire(t, g.Resource, "A", 200*time.Millisecond)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
	require.NoError(t, b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: a.Token}))
	_, err = tx.Exec(b.ctx, `INSERT INTO reports VALUES (1, 'a', NULL)`)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)

	acquired := make(chan lease.Lease, 1)
	go func() {
		defer close(acquired)
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: g.Resource, Holder: "B", TTL: time.Minute})
		if err == nil {
			acquired <- l
		}
	}()
	select {
	case <-acquired:
		t.Fatal("the lease was taken over while a transaction that presented its token was open")
	case <-time.After(300 * time.Millisecond):
	}
	_, err = tx.Exec(b.ctx, `SAVEPOINT late`)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO reports VALUES (2, 'a-late', NULL)`)
	requireSQLState(t, err, fence.SQLStateLeaseNotHeld, "a statement after the lease expired")
	_, err = tx.Exec(b.ctx, `ROLLBACK TO SAVEPOINT late`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	bl, ok := <-acquired
	require.True(t, ok, "B acquires once A's transaction ended")
	require.Greater(t, bl.Token, a.Token)
	err = b.txWith(t, g.Resource, a.Token, `UPDATE reports SET val = 'late'`)
	requireStale(t, err, g.Resource, a.Token, bl.Token)
	require.Equal(t, fmt.Sprintf("1:a:%d", a.Token), b.rowsOf(t, "reports"))
}

// Attaching the guard again replaces the first form (00003's
// pgquota.fence_guard, INSERT and UPDATE only, token read from the row):
// the old trigger goes, whatever its name, and the table is guarded by the
// presented token from then on. Until then the old trigger keeps working.
func TestFenceGuardUpgradesFirstForm(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.appDDL(t, `
		CREATE TABLE reports (id int PRIMARY KEY, val text, tok bigint);
		CREATE TRIGGER pgquota_fence_guard BEFORE INSERT OR UPDATE ON reports
			FOR EACH ROW EXECUTE FUNCTION pgquota.fence_guard('tok', 'public.reports');
		CREATE TRIGGER my_guard BEFORE INSERT OR UPDATE ON reports
			FOR EACH ROW EXECUTE FUNCTION pgquota.fence_guard('tok', 'public.reports')`, nil, "reports")
	h := b.acquire(t, "public.reports", "holder", time.Minute)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO reports VALUES (1, 'old', $1)`, h.Token)
	require.NoError(t, err, "the first form still works")
	_, err = b.pool.Exec(b.ctx, `INSERT INTO reports VALUES (2, 'old', $1)`, h.Token-1)
	requireSQLState(t, err, fence.SQLStateStaleToken, "the first form still refuses a low token")

	g, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "reports", Column: "tok"})
	require.NoError(t, err)
	require.True(t, g.Upgraded)
	var triggers string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
		SELECT string_agg(tgname || '=' || tgfoid::regproc::text, ',' ORDER BY tgname)
		FROM pg_trigger WHERE tgrelid = 'reports'::regclass AND NOT tgisinternal`).Scan(&triggers))
	require.Equal(t, "pgquota_fence_guard=pgquota.fence_guard_presented,pgquota_fence_guard_truncate=pgquota.fence_guard_presented", triggers)
	_, err = b.pool.Exec(b.ctx, `UPDATE reports SET val = 'x'`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented)
	require.NoError(t, b.txWith(t, g.Resource, h.Token, `UPDATE reports SET val = 'new'`))

	g, err = fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "reports", Column: "tok"})
	require.NoError(t, err)
	require.False(t, g.Upgraded, "nothing left to upgrade")

	// Only bigint token columns: tokens are 64-bit.
	b.appDDL(t, `CREATE TABLE small (id int PRIMARY KEY, tok integer)`, nil, "small")
	_, err = fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "small", Column: "tok"})
	var ie *quota.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "column", ie.Field)
	require.Contains(t, ie.Reason, "must be bigint")
}

// PresentTokenTx refuses bad input before sending anything, naming the
// field; MapFenceError leaves errors that are not the fence's alone.
func TestPresentTokenInput(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	for _, c := range []struct {
		req   fence.PresentTokenRequest
		field string
	}{
		{fence.PresentTokenRequest{Token: 1}, "resource"},
		{fence.PresentTokenRequest{Resource: "r\n", Token: 1}, "resource"},
		{fence.PresentTokenRequest{Resource: "r", Token: 0}, "token"},
		{fence.PresentTokenRequest{Resource: "r", Token: 1, Lease: "l\x00"}, "lease name"},
	} {
		err := b.fences.PresentTokenTx(b.ctx, tx, c.req)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie, "%+v", c.req)
		require.Equal(t, c.field, ie.Field)
	}
	_, err = tx.Exec(b.ctx, `SELECT 1`)
	require.NoError(t, err, "nothing was sent: the transaction is intact")
	other := errors.New("x")
	require.Same(t, other, fence.MapError(other))
}

// The guard stamps the presented token into the token column of every row
// inserted or updated, whatever the statement set it to or left alone.
func TestFenceGuardStampsPresentedToken(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	h1 := b.acquire(t, g.Resource, "one", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h1.Token, `INSERT INTO reports VALUES (1, 'a', NULL), (2, 'a', 999999)`))
	require.Equal(t, fmt.Sprintf("1:a:%d,2:a:%d", h1.Token, h1.Token), b.rowsOf(t, "reports"))
	_, err := b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: h1.Token})
	require.NoError(t, err)
	h2 := b.acquire(t, g.Resource, "two", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h2.Token, `UPDATE reports SET val = 'b' WHERE id = 1`))
	require.Equal(t, fmt.Sprintf("1:b:%d,2:a:%d", h2.Token, h1.Token), b.rowsOf(t, "reports"))
}

// Holders taking the lease in turn write a guarded counter under their
// presented tokens, while stale writers keep trying with every token
// already released: the counter ends at exactly the number of writes the
// holders committed, and no stale writer's statement ever lands.
func TestFenceGuardConcurrentHoldersAndStaleWriters(t *testing.T) {
	t.Parallel()
	b := setup(t, 12)
	b.appDDL(t, `CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL, tok bigint)`, nil, "counter")
	g, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "counter", Column: "tok"})
	require.NoError(t, err)
	h := b.acquire(t, g.Resource, "setup", time.Minute)
	require.NoError(t, b.txWith(t, g.Resource, h.Token, fmt.Sprintf(`INSERT INTO counter VALUES (1, 0, %d)`, h.Token)))
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: h.Token})
	require.NoError(t, err)

	const holders, rounds, stale = 4, 8, 3
	var mu sync.Mutex
	released := []int64{h.Token}
	var committed, staleLanded, staleRefused atomic.Int64
	done := make(chan struct{})
	var wg, staleWG sync.WaitGroup
	for w := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				var l lease.Lease
				for {
					var err error
					l, err = b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: g.Resource, Holder: fmt.Sprint("holder-", w), TTL: 5 * time.Second})
					if err == nil {
						break
					}
					if !errors.Is(err, lease.ErrHeld) {
						t.Error(err)
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
				for {
					err := b.txWith(t, g.Resource, l.Token, `UPDATE counter SET n = n + 1 WHERE id = 1`)
					if err == nil {
						committed.Add(1)
						break
					}
					if c := sqlStateOf(err); c != "40001" && c != "40P01" {
						t.Errorf("holder %d with token %d: %v", w, l.Token, err)
						break
					}
				}
				if _, err := b.leases.Release(b.ctx, lease.Lease{Name: g.Resource, Token: l.Token}); err != nil {
					t.Error(err)
				}
				mu.Lock()
				released = append(released, l.Token)
				mu.Unlock()
			}
		}()
	}
	for s := range stale {
		staleWG.Add(1)
		go func() {
			defer staleWG.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				mu.Lock()
				tok := released[(i*7+s)%len(released)]
				mu.Unlock()
				var err error
				if i%2 == 0 {
					err = b.txWith(t, g.Resource, tok, `UPDATE counter SET n = n + 1000 WHERE id = 1`)
				} else {
					err = b.txWith(t, g.Resource, 0, `UPDATE counter SET n = n + 1000 WHERE id = 1`)
				}
				switch {
				case err == nil:
					staleLanded.Add(1)
				case errors.Is(err, fence.ErrStaleToken), errors.Is(err, lease.ErrLost),
					errors.Is(fence.MapError(err), fence.ErrTokenNotPresented), sqlStateOf(err) == "40001", sqlStateOf(err) == "40P01":
					staleRefused.Add(1)
				default:
					t.Errorf("stale writer: %v", err)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(done)
	staleWG.Wait()

	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT n FROM counter`).Scan(&n))
	require.Equal(t, int64(holders*rounds), committed.Load())
	require.Equal(t, committed.Load(), n, "the counter holds exactly the holders' writes")
	require.Zero(t, staleLanded.Load(), "stale writes landed")
	require.Positive(t, staleRefused.Load())
	t.Logf("%d holder writes committed, %d stale statements refused, 0 landed", committed.Load(), staleRefused.Load())
}
