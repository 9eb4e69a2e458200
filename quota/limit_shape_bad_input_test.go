package quota_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Bad definitions and grants of the new kinds: an *InputError naming the
// field, and nothing written (no quota, shape or state rows appear).
func TestLimitShapeBadInputNamesTheFieldAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "ok", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Second})
	counts := func() [5]int64 {
		return [5]int64{b.countRows(t, "quota"), b.countRows(t, "quota_shape"), b.countRows(t, "usage"), b.countRows(t, "rate_state"), b.countRows(t, "rolling_usage")}
	}
	before := counts()
	origin := time.Date(2026, 1, 1, 0, 0, 0, 500, time.UTC)
	defs := []struct {
		name  string
		def   quota.Definition
		field string
	}{
		{"rate 0", quota.Definition{Name: "x", Window: quota.WindowRate, DefaultLimit: ptr(int64(0)), Period: time.Second}, "rate"},
		{"negative burst", quota.Definition{Name: "x", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Second, Burst: -1}, "burst"},
		{"window 0", quota.Definition{Name: "x", Window: quota.WindowFixed, DefaultLimit: ptr(int64(5))}, "period"},
		{"rolling 0", quota.Definition{Name: "x", Window: quota.WindowRolling, DefaultLimit: ptr(int64(5))}, "period"},
		{"negative period", quota.Definition{Name: "x", Window: quota.WindowRolling, DefaultLimit: ptr(int64(5)), Period: -time.Second}, "period"},
		{"sub-millisecond period", quota.Definition{Name: "x", Window: quota.WindowFixed, DefaultLimit: ptr(int64(5)), Period: 1500 * time.Microsecond}, "period"},
		{"period above 100 years", quota.Definition{Name: "x", Window: quota.WindowFixed, DefaultLimit: ptr(int64(5)), Period: 36526 * 24 * time.Hour}, "period"},
		{"origin not on a millisecond", quota.Definition{Name: "x", Window: quota.WindowFixed, DefaultLimit: ptr(int64(5)), Period: time.Minute, Origin: origin}, "origin"},
		{"origin on a rate", quota.Definition{Name: "x", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Second, Origin: time.Unix(60, 0)}, "origin"},
		{"burst on a window", quota.Definition{Name: "x", Window: quota.WindowFixed, DefaultLimit: ptr(int64(5)), Period: time.Second, Burst: 3}, "burst"},
		{"period on a calendar window", quota.Definition{Name: "x", Window: quota.WindowDay, DefaultLimit: ptr(int64(5)), Period: time.Second}, "window"},
		{"rolling limit above the bound", quota.Definition{Name: "x", Window: quota.WindowRolling, DefaultLimit: ptr(int64(quota.MaxRollingLimit + 1)), Period: time.Second}, "default limit"},
		{"time zone on a rate", quota.Definition{Name: "x", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Second, TimeZone: "Europe/Berlin"}, "time zone"},
	}
	for _, c := range defs {
		_, err := b.operator.DefineQuota(b.ctx, c.def)
		var ie *quota.InputError
		require.True(t, errors.As(err, &ie), "%s: %v", c.name, err)
		require.ErrorIs(t, err, quota.ErrInvalidInput, c.name)
		require.Equal(t, c.field, ie.Field, "%s: %v", c.name, err)
	}
	grants := []struct {
		name  string
		req   quota.GrantRequest
		field string
	}{
		{"key with a rate", quota.GrantRequest{Quota: "ok", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k"}}, "idempotency key"},
		{"key with several quotas", quota.GrantRequest{Quotas: []string{"ok"}, Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k"}}, "idempotency key"},
		{"limit with several quotas", quota.GrantRequest{Quotas: []string{"ok"}, Member: "m", Amount: 1, Limit: ptr(int64(3))}, "limit"},
		{"a quota named twice", quota.GrantRequest{Quotas: []string{"ok", "ok"}, Member: "m", Amount: 1}, "quotas[1]"},
		{"an empty quota name", quota.GrantRequest{Quotas: []string{"ok", ""}, Member: "m", Amount: 1}, "quotas[1]"},
		{"quota and quotas", quota.GrantRequest{Quota: "ok", Quotas: []string{"ok"}, Member: "m", Amount: 1}, "quota"},
		{"amount 0", quota.GrantRequest{Quota: "ok", Member: "m", Amount: 0}, "amount"},
		{"no member", quota.GrantRequest{Quotas: []string{"ok"}, Amount: 1}, "member"},
	}
	for _, c := range grants {
		_, err := b.client.Grant(b.ctx, c.req)
		var ie *quota.InputError
		require.True(t, errors.As(err, &ie), "%s: %v", c.name, err)
		require.Equal(t, c.field, ie.Field, "%s: %v", c.name, err)
	}
	// A rolling quota whose member override is above the bound: refused at
	// grant time, naming the limit, nothing written.
	b.define(t, quota.Definition{Name: "roll", Window: quota.WindowRolling, DefaultLimit: ptr(int64(10)), Period: time.Second})
	_, err := b.operator.SetMemberLimit(b.ctx, "roll", "big", quota.MaxRollingLimit+1)
	require.NoError(t, err)
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "roll", Member: "big", Amount: 1})
	var ie *quota.InputError
	require.True(t, errors.As(err, &ie), "%v", err)
	require.Equal(t, "limit", ie.Field)
	require.Equal(t, int64(0), b.countRows(t, "rolling_usage"))
	after := counts()
	after[0] -= 1 // "roll"
	after[1] -= 1
	require.Equal(t, before, after, "rows of quota, quota_shape, usage, rate_state, rolling_usage")
}
