package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// GrantBatch serves calendar quotas: a request with Quotas, or for a quota
// of kind rate, fixed or rolling, gets its own ErrInvalidInput in
// BatchOutcome.Err (naming Grant), and the batch's calendar requests are
// still decided, keyed or not; nothing is written for the refused ones.
func TestGrantBatchShapedRequestRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr(int64(100))})
	b.define(t, quota.Definition{Name: "rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	b.define(t, quota.Definition{Name: "fixed", Window: quota.WindowFixed, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	b.define(t, quota.Definition{Name: "rolling", Window: quota.WindowRolling, DefaultLimit: ptr(int64(10)), Period: time.Hour})
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "unkeyed", true: "keyed"}[keyed], func(t *testing.T) {
			member := map[bool]string{false: "u", true: "k"}[keyed]
			key := func(k string) quota.IdempotencyKey {
				if !keyed {
					return quota.IdempotencyKey{}
				}
				return quota.IdempotencyKey{Key: k}
			}
			// a fresh client: no kind cached
			c, err := quota.New(b.pool, testConfig(t, nil))
			require.NoError(t, err)
			outs, err := c.GrantBatch(b.ctx, []quota.GrantRequest{
				{Quota: "day", Member: member, Amount: 2, Idempotency: key("a")},
				{Quota: "rate", Member: member, Amount: 1, Idempotency: key("b")},
				{Quotas: []string{"day", "rate"}, Member: member, Amount: 1},
				{Quota: "fixed", Member: member, Amount: 1, Idempotency: key("c")},
				{Quota: "rolling", Member: member, Amount: 1, Idempotency: key("d")},
				{Quota: "day", Member: member, Amount: 3, Idempotency: key("e")},
			})
			require.NoError(t, err)
			require.Len(t, outs, 6)
			require.NoError(t, outs[0].Err)
			require.True(t, outs[0].Granted)
			require.NoError(t, outs[5].Err)
			require.True(t, outs[5].Granted)
			require.Equal(t, int64(5), outs[5].Used)
			for _, i := range []int{1, 2, 3, 4} {
				require.ErrorIs(t, outs[i].Err, quota.ErrInvalidInput, "request %d", i)
				require.Contains(t, outs[i].Err.Error(), "GrantBatch serves calendar quotas", "request %d", i)
				require.Contains(t, outs[i].Err.Error(), "use Grant", "request %d", i)
				require.False(t, outs[i].Granted)
			}
			require.Contains(t, outs[1].Err.Error(), `"rate" is of kind rate`)
			sum, _ := b.usageRows(t, "day", member)
			require.Equal(t, int64(5), sum, "only the two day requests moved the day counter")
			// The rate is untouched: its whole burst is still there.
			res, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "rate", Member: member, Amount: 10})
			require.NoError(t, err)
			require.True(t, res.Granted)
		})
	}
}
