package quota_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// CompensateGrant of a 2-unit grant races 63 GrantTx(+2) in transactions that
// hold the counter while they commit or roll back. The counter starts at
// 0 or 1 (a Revoke took part of the grant's units back), so the version in
// the revoke's snapshot holds fewer units than the version it ends up
// locking whenever it waits for a grant that then commits: the revoke must
// give back what the locked version holds (at most the grant's 2), never
// fail, and leave the counter at the committed grants minus what it gave
// back.
func TestRevokeGrantRacesGrantTx(t *testing.T) {
	t.Parallel()
	const rounds, copies = 100, 64
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](1 << 20)})
	failures := 0
	for round := range rounds {
		member := fmt.Sprint("m", round)
		g, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: member, Amount: 2, Idempotency: key(member)})
		require.NoError(t, err)
		require.True(t, g.Granted)
		start := int64(round % 2) // the counter before the race: 0 or 1
		_, err = b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: member, Amount: 2 - start})
		require.NoError(t, err)

		var mu sync.Mutex
		var committed int64
		var revoked quota.CompensateGrantResult
		var errs []error
		concurrently(copies, func(i int) {
			if i == copies/2 {
				rv, err := b.client.CompensateGrant(b.ctx, g.GrantID)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("CompensateGrant: %w", err))
				}
				revoked = rv
				return
			}
			tx, err := b.pool.BeginTx(b.ctx, readCommitted)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			defer func() { _ = tx.Rollback(b.ctx) }()
			res, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: member, Amount: 2})
			if err == nil && i%3 != 0 { // a third roll back
				err = tx.Commit(b.ctx)
				if err == nil && res.Granted {
					mu.Lock()
					committed += res.Amount
					mu.Unlock()
				}
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("GrantTx: %w", err))
				mu.Unlock()
			}
		})
		if len(errs) > 0 {
			failures++
			t.Errorf("round %d: %v", round, errs)
			continue
		}
		require.False(t, revoked.Replayed)
		require.LessOrEqual(t, revoked.Revoked, int64(2), "round %d: never more than the grant took", round)
		require.GreaterOrEqual(t, revoked.Revoked, start, "round %d: at least what the counter held before", round)
		sum, _ := b.usageRows(t, "q", member)
		require.Equal(t, start+committed-revoked.Revoked, sum, "round %d: the counter is the committed grants minus what the revoke gave back", round)
		e, err := b.client.LedgerEntry(b.ctx, g.GrantID)
		require.NoError(t, err)
		require.NotNil(t, e.Compensation)
		require.Equal(t, revoked.Revoked, e.Compensation.Revoked)
	}
	require.Zero(t, failures, "rounds with errors, of %d", rounds)
}
