package lease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// TestLeaseCallsCommitDurablyUnderAsyncCommit proves that each call that
// issues or admits a token raises its transaction's synchronous_commit from
// off to on, inside the caller's transaction too, so its commit waits for
// the WAL flush (see lease_crash_test.go for the crash itself), and that it
// leaves every other value as it is: 'local' and the remote levels flush
// the local WAL before the commit returns already.
func TestLeaseCallsCommitDurablyUnderAsyncCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r", Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	b.appDDL(t, `CREATE TABLE public.reports (id int PRIMARY KEY, val text NOT NULL, tok bigint)`, nil, "public.reports")
	_, err = fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "public.reports", Column: "tok", Lease: "r"})
	require.NoError(t, err)

	calls := []struct {
		name string
		call func(tx pgx.Tx) error
	}{
		{"AcquireTx", func(tx pgx.Tx) error {
			_, err := b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: "other", Holder: "A", TTL: time.Hour})
			return err
		}},
		{"AcquireTx of a held lease by its own attempt", func(tx pgx.Tx) error {
			_, err := b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: "r", Holder: "A", Attempt: l.Attempt, TTL: time.Hour})
			return err
		}},
		{"RenewTx", func(tx pgx.Tx) error {
			_, err := b.leases.RenewTx(b.ctx, tx, lease.Lease{Name: "r", Token: l.Token}, time.Hour)
			return err
		}},
		{"WriteFencedRowTx with a lease", func(tx pgx.Tx) error {
			_, err := b.fences.WriteRowTx(b.ctx, tx, fence.WriteRowRequest{Resource: "r", Key: "k", Token: l.Token, Lease: "r"})
			return err
		}},
		{"WriteFencedRowTx with an external token", func(tx pgx.Tx) error {
			_, err := b.fences.WriteRowTx(b.ctx, tx, fence.WriteRowRequest{Resource: "ext", Key: "k", Token: 5})
			return err
		}},
		{"a write of a table with the fence guard", func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `SELECT pgquota.present_token('public.reports', $1, 'r')`, l.Token); err != nil {
				return fence.MapError(err)
			}
			_, err := tx.Exec(b.ctx, `INSERT INTO public.reports (id, val, tok) VALUES (1, 'v', NULL)
				ON CONFLICT (id) DO UPDATE SET val = excluded.val`)
			return fence.MapError(err)
		}},
		{"ReleaseTx", func(tx pgx.Tx) error {
			_, err := b.leases.ReleaseTx(b.ctx, tx, lease.Lease{Name: "r", Token: l.Token})
			return err
		}},
	}
	for _, level := range []struct{ set, after string }{
		{"off", "on"}, {"local", "local"}, {"remote_write", "remote_write"}, {"on", "on"}, {"remote_apply", "remote_apply"},
	} {
		for _, c := range calls {
			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			_, err = tx.Exec(b.ctx, "SELECT set_config('synchronous_commit', $1, true)", level.set)
			require.NoError(t, err)
			require.NoError(t, c.call(tx), c.name)
			var got string
			require.NoError(t, tx.QueryRow(b.ctx, "SHOW synchronous_commit").Scan(&got))
			require.NoError(t, tx.Rollback(b.ctx))
			require.Equal(t, level.after, got, "%s under synchronous_commit = %s", c.name, level.set)
		}
	}
}
