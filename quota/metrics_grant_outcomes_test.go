package quota_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Two replicas grant 500 units of a limit of 300 at once: their counters
// add up to exactly 300 granted, 200 denied and 300 units, the same as the
// database's counter, and a bad request counts as one error.
func TestMetricsGrantOutcomesAddUpAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "api", Window: quota.WindowDay, DefaultLimit: ptr(int64(300))})
	c1, m1 := b.meteredClient(t, nil)
	c2, m2 := b.meteredClient(t, nil)

	var wg sync.WaitGroup
	errs := make(chan error, 500)
	for i := range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := c1
			if i%2 == 1 {
				c = c2
			}
			if _, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "api", Member: "m", Amount: 1}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	_, err := c1.Grant(b.ctx, quota.GrantRequest{Quota: "api", Member: "m", Amount: 0})
	require.ErrorIs(t, err, quota.ErrInvalidInput)

	used, _ := b.usageRows(t, "api", "m")
	require.Equal(t, int64(300), used)
	for outcome, want := range map[string]int64{"granted": 300, "denied": 200, "error": 1} {
		require.Equal(t, want, sumOf(t, "pgquota.grant.requests", map[string]string{"pgquota.operation": "grant", "pgquota.outcome": outcome}, m1, m2), outcome)
	}
	require.Equal(t, int64(300), sumOf(t, "pgquota.grant.units", nil, m1, m2))
	n, _ := histOf(t, "pgquota.operation.duration", map[string]string{"pgquota.operation": "grant"}, m1, m2)
	require.Equal(t, uint64(501), n)
	// No quota name unless asked for: the series stay bounded.
	require.False(t, attrKeys(t, m1, "pgquota.grant.requests")[quota.AttrQuota])
}

// With MetricsQuotaName the grant counters carry the quota name, also for
// an error (taken from the request) and for GrantBatch's requests.
func TestMetricsQuotaNameOnlyWhenOptedIn(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "a", Window: quota.WindowNone, DefaultLimit: ptr(int64(2))})
	b.define(t, quota.Definition{Name: "b", Window: quota.WindowNone, DefaultLimit: ptr(int64(1))})
	c, m := b.meteredClient(t, &quota.Config{MetricsQuotaName: true})
	for range 3 {
		_, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "a", Member: "x", Amount: 1})
		require.NoError(t, err)
	}
	_, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "missing", Member: "x", Amount: 1})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
	outs, err := c.GrantBatch(b.ctx, []quota.GrantRequest{
		{Quota: "b", Member: "x", Amount: 1}, {Quota: "b", Member: "x", Amount: 1}, {Quota: "b", Member: "", Amount: 1},
	})
	require.NoError(t, err)
	require.Len(t, outs, 3)

	for _, tc := range []struct {
		quota, op, outcome string
		want               int64
	}{
		{"a", "grant", "granted", 2}, {"a", "grant", "denied", 1}, {"missing", "grant", "error", 1},
		{"b", "grant_batch", "granted", 1}, {"b", "grant_batch", "denied", 1}, {"b", "grant_batch", "error", 1},
	} {
		got := sumOf(t, "pgquota.grant.requests", map[string]string{"pgquota.quota": tc.quota, "pgquota.operation": tc.op, "pgquota.outcome": tc.outcome}, m)
		require.Equal(t, tc.want, got, "%+v", tc)
	}
	require.Equal(t, int64(2), sumOf(t, "pgquota.grant.units", map[string]string{"pgquota.quota": "a"}, m))
	require.Equal(t, int64(1), sumOf(t, "pgquota.grant.units", map[string]string{"pgquota.quota": "b"}, m))
	// GrantBatch's size: one batch of three requests.
	n, sum := histOf(t, "pgquota.grant.statement.size", map[string]string{"pgquota.path": "batch"}, m)
	require.Equal(t, uint64(1), n)
	require.Equal(t, 3.0, sum)
}

// Coalesced grants: the statement sizes add up to the calls, one point per
// statement the coalescer sent, and every call is counted once by outcome.
func TestMetricsCoalescedStatementSizesAddUpToCalls(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "hot", Window: quota.WindowDay, DefaultLimit: ptr(int64(150))})
	c, m := b.meteredClient(t, &quota.Config{Grouping: quota.GroupByCounter})
	var mu sync.Mutex
	statements := 0
	quota.SetCoalesceSend(c, func(int) { mu.Lock(); statements++; mu.Unlock() })
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "hot", Member: "m", Amount: 1})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n, sum := histOf(t, "pgquota.grant.statement.size", map[string]string{"pgquota.path": "coalesce"}, m)
	mu.Lock()
	require.Equal(t, uint64(statements), n)
	mu.Unlock()
	require.Equal(t, 200.0, sum)
	require.Equal(t, int64(150), sumOf(t, "pgquota.grant.requests", map[string]string{"pgquota.outcome": "granted"}, m))
	require.Equal(t, int64(50), sumOf(t, "pgquota.grant.requests", map[string]string{"pgquota.outcome": "denied"}, m))
}

// Replayed keyed grants are counted as requests, but their units only once.
func TestMetricsReplayedGrantUnitsCountedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "k", Window: quota.WindowNone, DefaultLimit: ptr(int64(10))})
	c, m := b.meteredClient(t, nil)
	for i := range 3 {
		res, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "k", Member: "x", Amount: 4, Idempotency: quota.IdempotencyKey{Key: "op-1"}})
		require.NoError(t, err)
		require.Equal(t, i > 0, res.Replayed, fmt.Sprint(i))
	}
	require.Equal(t, int64(3), sumOf(t, "pgquota.grant.requests", map[string]string{"pgquota.outcome": "granted"}, m))
	require.Equal(t, int64(4), sumOf(t, "pgquota.grant.units", nil, m))
}
