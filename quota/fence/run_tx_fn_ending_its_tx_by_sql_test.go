package fence_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// As TestRunTxFnEndingItsTxReportsOutcomeUnknown, with fn ending the
// transaction by SQL (tx.Exec("ROLLBACK")) instead of tx.Commit: RunTx
// sends its COMMIT outside any transaction, PostgreSQL answers WARNING
// 25P01 with tag COMMIT, and RunTx returns nil although nothing was
// committed. nil must mean fn's writes stand.
func TestRunTxFnRollingBackBySQLIsNotReportedAsCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)
	l := b.acquire(t, g.Resource, "A", time.Minute)

	err := b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: l.Token}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `ROLLBACK`)
		return err
	})
	rows := b.rowsOf(t, "orders")
	t.Logf("RunTx returned %v; rows: %q", err, rows)
	if err == nil {
		require.NotEmpty(t, rows, "RunTx returned nil, so fn's write must have committed")
	}
	require.ErrorIs(t, err, quota.ErrOutcomeUnknown, "fn ended its transaction itself")
}
