package quota_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"40001": true, "40P01": true, "23505": false, "57014": false} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, quota.IsRetryable(err), code)
	}
	require.False(t, quota.IsRetryable(errors.New("40001")))
	require.False(t, quota.IsRetryable(nil))
}

// RunInTx runs a transaction that fails with a serialization failure again,
// and returns other errors at once.
func TestRunInTxRetriesSerializationFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
	_, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err)

	attempts := 0
	err = quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		attempts++
		// Take the snapshot, then let another session change the counter.
		var used int64
		if err := tx.QueryRow(b.ctx, `SELECT used FROM pgquota.usage WHERE member = 'm'`).Scan(&used); err != nil {
			return err
		}
		if attempts == 1 {
			if _, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}); err != nil {
				return err
			}
		}
		_, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
		if attempts == 1 {
			require.True(t, quota.IsRetryable(err), "a concurrent update of the counter: %v", err)
		}
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 2, attempts)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(3), sum)

	attempts = 0
	errOther := errors.New("not retryable")
	err = quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		attempts++
		return errOther
	})
	require.ErrorIs(t, err, errOther)
	require.Equal(t, 1, attempts)
}
