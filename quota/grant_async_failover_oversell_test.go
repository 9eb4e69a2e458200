package quota_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// TestAsyncFailoverOversellsEachLimitByTheGrantsItLost pins the figure the
// docs/failover.md gives for grants across a failover to an asynchronous standby, on
// real clusters: every member of a lifetime quota with limit 5 has 3 units
// the standby received (kept); the standby is cut off, and the old primary
// grants member m<i> i more units (lost), then crashes; the promoted
// standby grants each member up to the limit again (new = 2). Counting the
// grants reported on both sides, member m<i> was sold 3 + i + 2 units:
// over the limit by exactly i, the units of its grants lost in the
// failover, and 3 in all.
func TestAsyncFailoverOversellsEachLimitByTheGrantsItLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit, kept = 5, 3
	primary, op := failoverPrimary(t)
	_, err := op.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr(int64(limit))})
	require.NoError(t, err)
	old := failoverClient(t, primary)
	grantAll := func(c *quota.Client, member string, n int) int {
		t.Helper()
		granted := 0
		for range n {
			r, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: member, Amount: 1})
			require.NoError(t, err)
			if r.Granted {
				granted++
			}
		}
		return granted
	}
	members := []string{"m0", "m1", "m2"}
	reported := map[string]int{}
	for _, m := range members {
		reported[m] += grantAll(old, m, kept)
	}
	standby := primary.NewStandby("standby")
	standby.CutOff()
	for i, m := range members {
		reported[m] += grantAll(old, m, i) // lost: the standby never receives them
	}
	old.Pool().Close()
	op.Pool().Close()
	primary.Crash()
	standby.Promote()

	cur := failoverClient(t, standby)
	total := 0
	for i, m := range members {
		u, err := cur.Usage(ctx, "q", m)
		require.NoError(t, err)
		require.Equal(t, int64(kept), u.Used, "%s: the new primary has the units the standby received", m)
		got := grantAll(cur, m, limit) // until denied
		require.Equal(t, limit-kept, got, "%s: the new primary sells up to the limit again", m)
		reported[m] += got
		over := reported[m] - limit
		assert.Equal(t, i, over, "%s: sold %d units on both sides, over the limit by the %d units lost", m, reported[m], i)
		total += over
	}
	t.Logf("reported on both sides: %s; over the limit by %d units in all (= the units lost)", fmt.Sprint(reported), total)
	assert.Equal(t, 0+1+2, total)
}
