package httprate_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/httprate"
)

// Every denial with a finite wait sends Retry-After (and t=), for every
// kind and path: a day quota denied by a plain Grant (where it sent
// neither, reading Limits, which calendar grants leave empty), through
// GrantBatch, keyed, coalesced; a fixed window, a rolling window and a
// rate. A denial no wait changes (an amount above the limit, a lifetime
// quota) sends none.
func TestDenialSendsRetryAfterForEveryKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	owner := pgtest.ConnectOwner(t, dbURL, 1)
	_, err := owner.Exec(ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT '2026-03-01 01:00:00+00'::timestamptz $$`)
	require.NoError(t, err)
	var cfg quota.Config
	if pgtest.Pooled(t) {
		cfg.Pooler = quota.PoolerTransaction
	}
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), 4)
	c, err := quota.New(pool, &cfg)
	require.NoError(t, err)
	coalCfg := cfg
	coalCfg.Grouping = quota.GroupByCounter
	coal, err := quota.New(pool, &coalCfg)
	require.NoError(t, err)
	one := int64(1)
	for _, d := range []quota.Definition{
		{Name: "day", Window: quota.WindowDay, DefaultLimit: &one},
		{Name: "life", Window: quota.WindowNone, DefaultLimit: &one},
		{Name: "fixed", Window: quota.WindowFixed, DefaultLimit: &one, Period: time.Hour},
		{Name: "rolling", Window: quota.WindowRolling, DefaultLimit: &one, Period: time.Hour},
		{Name: "rate", Window: quota.WindowRate, DefaultLimit: &one, Period: time.Hour},
	} {
		_, err := c.DefineQuota(ctx, d)
		require.NoError(t, err)
		_, err = c.Grant(ctx, quota.GrantRequest{Quota: d.Name, Member: "m", Amount: 1})
		require.NoError(t, err)
	}
	denied := func(name string, res quota.GrantResult, want time.Duration) {
		t.Helper()
		require.False(t, res.Granted, name)
		rec := httptest.NewRecorder()
		require.True(t, httprate.Deny(rec, res), name)
		_, l := httprate.Fields(res)
		if want < 0 {
			require.Empty(t, rec.Header().Get("Retry-After"), name)
			return
		}
		secs := strconv.FormatInt(int64(want/time.Second), 10)
		require.Equal(t, secs, rec.Header().Get("Retry-After"), "%s: RetryAfter %s", name, res.RetryAfter)
		require.Contains(t, l, ";t=", name)
	}
	grant := func(cl *quota.Client, req quota.GrantRequest) quota.GrantResult {
		t.Helper()
		res, err := cl.Grant(ctx, req)
		require.NoError(t, err)
		return res
	}
	// The day ends 23 h after the pinned clock.
	denied("day", grant(c, quota.GrantRequest{Quota: "day", Member: "m", Amount: 1}), 23*time.Hour)
	denied("day coalesced", grant(coal, quota.GrantRequest{Quota: "day", Member: "m", Amount: 1}), 23*time.Hour)
	denied("day keyed", grant(c, quota.GrantRequest{Quota: "day", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k1"}}), 23*time.Hour)
	outs, err := c.GrantBatch(ctx, []quota.GrantRequest{{Quota: "day", Member: "m", Amount: 1}, {Quota: "day", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k2"}}})
	require.NoError(t, err)
	for i, o := range outs {
		require.NoError(t, o.Err)
		denied("day batch "+strconv.Itoa(i), o.GrantResult, 23*time.Hour)
	}
	denied("fixed", grant(c, quota.GrantRequest{Quota: "fixed", Member: "m", Amount: 1}), time.Hour)
	denied("rolling", grant(c, quota.GrantRequest{Quota: "rolling", Member: "m", Amount: 1}), time.Hour)
	denied("rate", grant(c, quota.GrantRequest{Quota: "rate", Member: "m", Amount: 1}), time.Hour)
	denied("day above limit", grant(c, quota.GrantRequest{Quota: "day", Member: "m", Amount: 2}), -1)
	denied("life", grant(c, quota.GrantRequest{Quota: "life", Member: "m", Amount: 1}), -1)
}
