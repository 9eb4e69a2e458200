package fence_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// RunTx documents that every error it returns means nothing was
// committed unless it wraps ErrOutcomeUnknown. An fn that commits tx
// itself (against the doc's "must not", but easy to do by mistake: a
// helper that calls tx.Commit) makes RunTx return pgx's "tx is closed"
// although fn's writes were committed: a caller that trusts the error
// retries and writes twice. RunTx must either report success or an
// error that says the writes landed (or refuse fn's Commit).
func TestRunTxFnEndingItsTxReportsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)
	l := b.acquire(t, g.Resource, "A", time.Minute)

	err := b.fences.RunTx(b.ctx, fence.TxRequest{Resource: g.Resource, Token: l.Token}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`); err != nil {
			return err
		}
		return tx.Commit(b.ctx)
	})
	rows := b.rowsOf(t, "orders")
	t.Logf("RunTx returned %v; rows: %q", err, rows)
	if err != nil && !errorsIsOutcomeUnknown(err) {
		require.Empty(t, rows, "RunTx returned %q (not ErrOutcomeUnknown), so nothing may have been committed", err)
	}
	require.Equal(t, fmt.Sprintf("1:a:%d", l.Token), rows)
}

func errorsIsOutcomeUnknown(err error) bool {
	return errors.Is(err, quota.ErrOutcomeUnknown)
}
