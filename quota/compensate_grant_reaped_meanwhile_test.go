package quota_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A grant reaped from the ledger while CompensateGrant runs: the revoke gives
// nothing back and reports ErrGrantNotFound, as for a grant reaped before
// the call, not a bare "no rows in result set".
func TestRevokeGrantReapedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
	g, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Idempotency: key("k")})
	require.NoError(t, err)
	require.True(t, g.Granted)

	// The reaper's delete, not committed yet (as the owner: no pgquota role
	// deletes ledger rows by hand).
	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(b.ctx, `DELETE FROM pgquota.ledger WHERE grant_id = $1`, g.GrantID)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := b.client.CompensateGrant(b.ctx, g.GrantID)
		done <- err
	}()
	b.waitForLockWait(t)
	require.NoError(t, tx.Commit(b.ctx))
	require.ErrorIs(t, <-done, quota.ErrGrantNotFound)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(3), sum, "nothing given back")
}
