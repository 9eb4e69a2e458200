package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Client A caches a quota's kind; Client B redefines the quota with another
// kind. A's keyed grants must follow the new kind, not the cached one.
func TestShapeKindCacheStaleKeyedGrant(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	a := b.client
	other, err := quota.New(b.operator.Pool(), testConfig(t, nil)) // B redefines: operator work, on the operator's pool (b.pool in the normal pass)
	require.NoError(t, err)
	key := func(k string) quota.IdempotencyKey { return quota.IdempotencyKey{Key: k} }

	t.Run("rate redefined as day: keyed grants are served", func(t *testing.T) {
		b.define(t, quota.Definition{Name: "r2d", Window: quota.WindowRate, DefaultLimit: ptr(int64(10)), Period: time.Hour})
		_, err := a.Grant(b.ctx, quota.GrantRequest{Quota: "r2d", Member: "m", Amount: 1}) // A caches "rate"
		require.NoError(t, err)
		_, err = other.DefineQuota(b.ctx, quota.Definition{Name: "r2d", Window: quota.WindowDay, DefaultLimit: ptr(int64(10)), ReplaceKind: true})
		require.NoError(t, err)
		res, err := a.Grant(b.ctx, quota.GrantRequest{Quota: "r2d", Member: "m", Amount: 3, Idempotency: key("k1")})
		require.NoError(t, err, "a keyed grant on a quota now of kind day")
		require.True(t, res.Granted)
		require.NotZero(t, res.GrantID)
		sum, _ := b.usageRows(t, "r2d", "m")
		require.Equal(t, int64(3), sum)
	})

	t.Run("day redefined as fixed: the kind's refusal at once, nothing written", func(t *testing.T) {
		b.define(t, quota.Definition{Name: "d2f", Window: quota.WindowDay, DefaultLimit: ptr(int64(10))})
		_, err := a.Grant(b.ctx, quota.GrantRequest{Quota: "d2f", Member: "m", Amount: 1, Idempotency: key("k1")}) // A caches "day"
		require.NoError(t, err)
		_, err = other.DefineQuota(b.ctx, quota.Definition{Name: "d2f", Window: quota.WindowFixed, DefaultLimit: ptr(int64(10)), Period: time.Minute, ReplaceKind: true})
		require.NoError(t, err)
		// pgquota.grant_keyed reports the quota's kind: the stale cache
		// costs no extra call.
		_, err = a.Grant(b.ctx, quota.GrantRequest{Quota: "d2f", Member: "m", Amount: 1, Idempotency: key("k2")})
		require.ErrorIs(t, err, quota.ErrInvalidInput, "a keyed grant on a fixed window: %v", err)
		require.Contains(t, err.Error(), "idempotency key")
		var ledger int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.ledger WHERE idempotency_key = 'k2'`).Scan(&ledger))
		require.Zero(t, ledger, "no ledger row for the refused key")
		res, err := a.Grant(b.ctx, quota.GrantRequest{Quota: "d2f", Member: "m", Amount: 1})
		require.NoError(t, err)
		require.True(t, res.Granted)
		require.Len(t, res.Limits, 1)
		require.Equal(t, quota.WindowFixed, res.Limits[0].Window)
	})
}
