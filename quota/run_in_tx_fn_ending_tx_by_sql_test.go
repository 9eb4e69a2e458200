package quota_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// RunInTx documents that a function that ends its transaction itself makes
// the call report ErrOutcomeUnknown, and that any other error (and nil)
// means what it says. A function that ends the transaction with SQL
// (tx.Exec("ROLLBACK"), a helper running "COMMIT"), not through pgx's
// tx.Commit/Rollback, is not noticed: RunInTx sends COMMIT outside any
// transaction, PostgreSQL answers WARNING 25P01 "there is no transaction in
// progress" with tag COMMIT, and RunInTx returns nil. After a ROLLBACK by
// SQL, nil says the writes committed while none did; after a COMMIT by SQL
// the statements after it ran in autocommit, outside the transaction that
// a retry would run again. Either way RunInTx must not report a plain
// success: it can see the connection idle (TxStatus 'I') before its COMMIT.
func TestRunInTxFnEndingItsTxBySQLIsNotReportedAsCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.bundle().AppDDL(t, `CREATE TABLE public.runintx_sql_end (id int PRIMARY KEY)`, []string{"public"}, "public.runintx_sql_end")

	for _, end := range []string{"ROLLBACK", "COMMIT"} {
		t.Run(end, func(t *testing.T) {
			_, err := b.pool.Exec(b.ctx, `TRUNCATE public.runintx_sql_end`)
			require.NoError(t, err)
			err = quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
				if _, err := tx.Exec(b.ctx, `INSERT INTO public.runintx_sql_end VALUES (1)`); err != nil {
					return err
				}
				_, err := tx.Exec(b.ctx, end)
				return err
			})
			var n int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM public.runintx_sql_end`).Scan(&n))
			t.Logf("fn ran %s by SQL: RunInTx returned %v; rows written: %d", end, err, n)
			require.ErrorIs(t, err, quota.ErrOutcomeUnknown, "fn ended its transaction (%s by SQL); rows: %d", end, n)
		})
	}
}
