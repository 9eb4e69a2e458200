package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Redefining an existing quota with another kind fails with
// ErrQuotaKindChange and changes nothing, where it silently switched day to
// rate and the day's old counters came back when switched back. With
// ReplaceKind the kind changes and the counters of every kind are deleted,
// so switching back starts from zero. The same kind keeps its counters.
func TestDefineQuotaKindChangeNeedsReplaceKind(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	day := quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(10))}
	rate := quota.Definition{Name: "q", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Hour}
	b.define(t, day)
	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3})
	require.NoError(t, err)
	require.True(t, res.Granted)

	_, err = b.operator.DefineQuota(b.ctx, rate)
	require.ErrorIs(t, err, quota.ErrQuotaKindChange)
	require.ErrorContains(t, err, `quota "q" is of kind day, not rate`)
	require.ErrorContains(t, err, "deletes its counters")
	require.ErrorContains(t, err, "ReplaceKind")
	q, err := b.client.Quota(b.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, quota.WindowDay, q.Window, "nothing changed")
	require.Equal(t, int64(10), *q.DefaultLimit)
	u, err := b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(3), u.Used)

	// The same kind again keeps the counter.
	day.DefaultLimit = ptr(int64(20))
	b.define(t, day)
	u, err = b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(3), u.Used)

	rate.ReplaceKind = true
	q, err = b.operator.DefineQuota(b.ctx, rate)
	require.NoError(t, err)
	require.Equal(t, quota.WindowRate, q.Window)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2})
	require.NoError(t, err)
	require.True(t, res.Granted)

	// Back to day: a shaped kind to a calendar one needs the flag too, and
	// the day's old counter does not come back.
	day.ReplaceKind = false
	_, err = b.operator.DefineQuota(b.ctx, day)
	require.ErrorIs(t, err, quota.ErrQuotaKindChange)
	require.ErrorContains(t, err, `quota "q" is of kind rate, not day`)
	day.ReplaceKind = true
	b.define(t, day)
	u, err = b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, quota.WindowDay, u.Window)
	require.Zero(t, u.Used, "the old day counter is gone")
	rate.ReplaceKind = true
	b.define(t, rate)
	u, err = b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(5), u.Remaining, "the old rate bucket is gone")

	// A new quota needs no flag.
	_, err = b.operator.DefineQuota(b.ctx, quota.Definition{Name: "new", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Hour})
	require.NoError(t, err)
}
