package quota_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// TestGroupingDefaultsToGroupCommit: the zero Config groups across
// counters; the deprecated Coalesce alone selects GroupByCounter, with
// GroupCommit the default; an unknown Grouping is refused naming the field.
func TestGroupingDefaultsToGroupCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	cases := []struct {
		name string
		cfg  quota.Config
		want quota.Grouping
	}{
		{"zero Config", quota.Config{}, quota.GroupAcrossCounters},
		{"GroupNone", quota.Config{Grouping: quota.GroupNone}, quota.GroupNone},
		{"GroupByCounter", quota.Config{Grouping: quota.GroupByCounter}, quota.GroupByCounter},
		{"deprecated Coalesce", quota.Config{Coalesce: true}, quota.GroupByCounter},
		{"deprecated Coalesce and GroupCommit", quota.Config{Coalesce: true, GroupCommit: true}, quota.GroupAcrossCounters},
		{"Coalesce beside an explicit Grouping", quota.Config{Coalesce: true, Grouping: quota.GroupNone}, quota.GroupNone},
	}
	for _, c := range cases {
		cfg := c.cfg
		client, err := quota.New(b.pool, &cfg)
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, client.Config().Grouping, c.name)
	}
	_, err := quota.New(b.pool, &quota.Config{Grouping: quota.Grouping(7)})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.ErrorContains(t, err, "Config.Grouping")
	require.Equal(t, "Grouping(7)", quota.Grouping(7).String())
	require.Equal(t, "GroupByCounter", quota.GroupByCounter.String())
}
