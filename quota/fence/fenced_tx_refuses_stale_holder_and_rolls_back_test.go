package fence_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// The holder's FencedTx writes the guarded table, stamped with its token;
// once a successor has acquired the lease, the deposed holder's FencedTx is
// refused with ErrStaleToken before its function runs, and nothing of it
// is written; a released lease's token is refused with ErrLeaseLost.
func TestFencedTxHolderWritesAndStaleHolderWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)

	a := b.acquire(t, g.Resource, "A", 200*time.Millisecond)
	err := b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: a.Token}, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("1:a:%d", a.Token), b.rowsOf(t, "orders"), "the guard stamps the row with the presented token")

	time.Sleep(400 * time.Millisecond) // A pauses past its TTL
	bl := b.acquire(t, g.Resource, "B", time.Minute)
	require.Greater(t, bl.Token, a.Token)

	ran := 0
	err = b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: a.Token}, func(tx pgx.Tx) error {
		ran++
		_, err := tx.Exec(b.ctx, `UPDATE orders SET val = 'stale' WHERE id = 1`)
		return err
	})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, a.Token, stale.Token)
	require.Equal(t, bl.Token, stale.Highest, "the successor's acquire raised the resource's highest token")
	require.Zero(t, ran, "fn does not run under a refused token")
	require.Equal(t, fmt.Sprintf("1:a:%d", a.Token), b.rowsOf(t, "orders"), "the stale holder wrote nothing")

	err = b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: bl.Token}, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `UPDATE orders SET val = 'b' WHERE id = 1`)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("1:b:%d", bl.Token), b.rowsOf(t, "orders"))

	_, err = b.leases.Release(b.ctx, bl)
	require.NoError(t, err)
	err = b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: bl.Token}, func(tx pgx.Tx) error {
		ran++
		_, err := tx.Exec(b.ctx, `UPDATE orders SET val = 'released' WHERE id = 1`)
		return err
	})
	require.ErrorIs(t, err, lease.ErrLost, "a released lease's token no longer writes")
	require.Zero(t, ran)
	require.Equal(t, fmt.Sprintf("1:b:%d", bl.Token), b.rowsOf(t, "orders"))

	err = b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: bl.Token, Lease: "another-lease"}, func(tx pgx.Tx) error {
		ran++
		return nil
	})
	require.ErrorIs(t, err, fence.ErrWrongLease, "the table is bound to the lease named like its resource")
	require.Zero(t, ran)
}

// fn's error rolls the whole transaction back and is returned as fn gave
// it; a fence error of one of fn's statements (a guarded table whose
// resource fn did not present) also matches MapFenceError's sentinel and
// keeps fn's wrapping.
func TestFencedTxRollsBackWhenFnFails(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)
	b.guardReports(t, "audit", false)
	l := b.acquire(t, g.Resource, "A", time.Minute)
	req := fence.TxRequest{Resource: g.Resource, Token: l.Token}

	errBoom := errors.New("boom")
	err := b.fences.RunTx(b.ctx, req, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`); err != nil {
			return err
		}
		return fmt.Errorf("after the insert: %w", errBoom)
	})
	require.ErrorIs(t, err, errBoom)
	require.EqualError(t, err, "after the insert: boom")
	require.Empty(t, b.rowsOf(t, "orders"), "fn's error rolled its insert back")

	for name, wrap := range map[string]func(error) error{
		"bare":    func(err error) error { return err },
		"wrapped": func(err error) error { return fmt.Errorf("write audit: %w", err) },
	} {
		err = b.fences.RunTx(b.ctx, req, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (2, 'a')`); err != nil {
				return err
			}
			_, err := tx.Exec(b.ctx, `INSERT INTO audit (id, val) VALUES (1, 'x')`)
			return wrap(err)
		})
		require.ErrorIs(t, err, fence.ErrTokenNotPresented, name)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, name)
		require.Contains(t, err.Error(), "no fencing token presented for resource public.audit", name)
		if name == "wrapped" {
			require.Contains(t, err.Error(), "write audit: ", "fn's wrapping stays in the text")
		}
		require.Empty(t, b.rowsOf(t, "orders"), "%s: the failed statement rolled the whole transaction back", name)
		require.Empty(t, b.rowsOf(t, "audit"), name)
	}
}

// A serialization failure runs the transaction again from the start (the
// first run's writes rolled back); bad input is refused before anything is
// sent, and fn does not run.
func TestFencedTxRetriesSerializationFailureAndRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)
	l := b.acquire(t, g.Resource, "A", time.Minute)

	runs := 0
	err := b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: l.Token,
		TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, func(tx pgx.Tx) error {
		runs++
		if _, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES ($1, 'a')`, runs); err != nil {
			return err
		}
		var iso string
		if err := tx.QueryRow(b.ctx, `SHOW transaction_isolation`).Scan(&iso); err != nil {
			return err
		}
		if iso != "serializable" {
			return fmt.Errorf("isolation %q, want serializable", iso)
		}
		if runs == 1 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access (injected)"}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, runs, "the serialization failure ran fn again")
	require.Equal(t, fmt.Sprintf("2:a:%d", l.Token), b.rowsOf(t, "orders"), "only the second run committed")

	ran := false
	fn := func(pgx.Tx) error { ran = true; return nil }
	for _, tc := range []struct {
		name  string
		req   fence.TxRequest
		fn    func(pgx.Tx) error
		field string
	}{
		{"no resource", fence.TxRequest{Token: l.Token}, fn, "resource"},
		{"token 0", fence.TxRequest{Resource: g.Resource}, fn, "token"},
		{"bad lease name", fence.TxRequest{Resource: g.Resource, Token: l.Token, Lease: "a\x00"}, fn, "lease name"},
		{"nil fn", fence.TxRequest{Resource: g.Resource, Token: l.Token}, nil, "fn"},
	} {
		err := b.fences.RunTx(b.ctx, tc.req, tc.fn)
		require.ErrorIs(t, err, quota.ErrInvalidInput, tc.name)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie, tc.name)
		require.Equal(t, tc.field, ie.Field, tc.name)
	}
	require.False(t, ran)
}

// A COMMIT whose reply is lost leaves the outcome unknown: the error says
// so (ErrOutcomeUnknown), fn ran once and is not run again, and the write
// did land.
func TestFencedTxCommitReplyLostIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	direct := pgtest.Connect(t, dbURL, 4)
	client, err := quota.New(direct, nil)
	require.NoError(t, err)
	b := &testBundle{ctx: context.Background(), pool: direct, client: client, owner: pgtest.ConnectOwner(t, dbURL, 1), leases: leaseOf(t, client), fences: fenceOf(t, client)}
	g := b.guardReports(t, "orders", false)
	l := b.acquire(t, g.Resource, "A", time.Minute)

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy := newTagDropper(t, u.Host, "COMMIT")
	u.Host = proxy.Ln.Addr().String()
	viaProxy, err := quota.New(pgtest.Connect(t, u.String(), 1), nil)
	require.NoError(t, err)

	runs := 0
	proxy.Armed.Store(true)
	err = fenceOf(t, viaProxy).RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: l.Token}, func(tx pgx.Tx) error {
		runs++
		_, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`)
		return err
	})
	select {
	case <-proxy.Dropped:
	default:
		t.Fatalf("the proxy dropped no reply; FencedTx returned %v", err)
	}
	require.ErrorIs(t, err, quota.ErrOutcomeUnknown, "%v", err)
	require.Equal(t, 1, runs, "an unknown outcome is never run again")
	b.settle(t)
	require.Equal(t, fmt.Sprintf("1:a:%d", l.Token), b.rowsOf(t, "orders"), "the COMMIT landed although its reply was lost")
}
