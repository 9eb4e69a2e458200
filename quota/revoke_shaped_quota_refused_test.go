package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Revoke serves calendar quotas: on a quota of kind rate, fixed or rolling
// it returns an *InputError (ErrInvalidInput) naming the kind and what it
// serves, not date_trunc's raw 22023, and nothing is written (the state row
// of the member's earlier grant is unchanged). (Usage serves every kind:
// usage_every_kind_test.go.)
func TestRevokeShapedQuotaRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	b.define(t, quota.Definition{Name: "fixed", Window: quota.WindowFixed, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	b.define(t, quota.Definition{Name: "rolling", Window: quota.WindowRolling, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	for _, kind := range []string{"rate", "fixed", "rolling"} {
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: kind, Member: "m", Amount: 4})
		require.NoError(t, err)
		require.True(t, res.Granted)
		calls := map[string]func(*quota.Client) error{
			"revoke": func(c *quota.Client) error {
				_, err := c.Revoke(b.ctx, quota.RevokeRequest{Quota: kind, Member: "m", Amount: 1})
				return err
			},
			"revoke keyed": func(c *quota.Client) error {
				_, err := c.Revoke(b.ctx, quota.RevokeRequest{Quota: kind, Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k"}})
				return err
			},
		}
		for name, call := range calls {
			t.Run(kind+"/"+name, func(t *testing.T) {
				// a fresh client (no cached kind) and the one that granted
				fresh, err := quota.New(b.pool, testConfig(t, nil))
				require.NoError(t, err)
				for _, c := range []*quota.Client{fresh, b.client} {
					err := call(c)
					require.ErrorIs(t, err, quota.ErrInvalidInput)
					var ie *quota.InputError
					require.ErrorAs(t, err, &ie)
					require.Equal(t, "quota", ie.Field)
					require.Contains(t, err.Error(), "of kind "+kind)
					require.Contains(t, err.Error(), "serves calendar quotas only")
					require.NotContains(t, err.Error(), "22023")
				}
			})
		}
	}
	require.Zero(t, b.countRows(t, "ledger"), "no keyed revoke recorded")
	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "fixed", Member: "m", Amount: 6})
	require.NoError(t, err)
	require.True(t, res.Granted, "the fixed window still holds exactly 4 units")
	require.Equal(t, int64(10), res.Used)
}
