package httprate_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/httprate"
)

// Real grants (clock pinned) rendered as RateLimit-Policy, RateLimit and
// Retry-After, and Deny answering 429 only for a denial.
func TestDenyWritesRateLimitFieldsAndRetryAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), 2)
	owner := pgtest.ConnectOwner(t, dbURL, 1)
	_, err := owner.Exec(ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT '2026-03-01 12:00:30+00'::timestamptz $$`)
	require.NoError(t, err)
	var cfg *quota.Config
	if pgtest.Pooled(t) {
		cfg = &quota.Config{Pooler: quota.PoolerTransaction}
	}
	c, err := quota.New(pool, cfg)
	require.NoError(t, err)
	twenty, ten := int64(20), int64(10)
	_, err = c.DefineQuota(ctx, quota.Definition{Name: "api", Window: quota.WindowRate, DefaultLimit: &ten, Period: time.Second, Burst: 20})
	require.NoError(t, err)
	_, err = c.DefineQuota(ctx, quota.Definition{Name: "hourly", Window: quota.WindowHour, DefaultLimit: &twenty})
	require.NoError(t, err)

	res, err := c.Grant(ctx, quota.GrantRequest{Quota: "api", Member: "k", Amount: 15})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	require.False(t, httprate.Deny(rec, res))
	require.Equal(t, `"api";q=20;w=2`, rec.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"api";r=5;t=2`, rec.Header().Get("RateLimit"), "15 units take 1.5 s to drain")
	require.Empty(t, rec.Header().Get("Retry-After"))

	res, err = c.Grant(ctx, quota.GrantRequest{Quotas: []string{"api", "hourly"}, Member: "k", Amount: 6})
	require.NoError(t, err)
	require.False(t, res.Granted)
	rec = httptest.NewRecorder()
	require.True(t, httprate.Deny(rec, res))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "1", rec.Header().Get("Retry-After"), "one unit each 100 ms: 6 units fit after 100 ms, rounded up to 1 s")
	require.Equal(t, `"api";q=20;w=2, "hourly";q=20;w=3600`, rec.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"api";r=5;t=2, "hourly";r=20;t=3570`, rec.Header().Get("RateLimit"))
	require.Contains(t, rec.Body.String(), `"api"`)

	// A calendar grant on its own: the window gives w, its ResetAfter t,
	// and a denial its Retry-After, as through Quotas.
	res, err = c.Grant(ctx, quota.GrantRequest{Quota: "hourly", Member: "k", Amount: 20})
	require.NoError(t, err)
	p, l := httprate.Fields(res)
	require.Equal(t, `"hourly";q=20;w=3600`, p)
	require.Equal(t, `"hourly";r=0;t=3570`, l)
	res, err = c.Grant(ctx, quota.GrantRequest{Quota: "hourly", Member: "k", Amount: 1})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Equal(t, "3570", httprate.RetryAfter(res))
	res, err = c.Grant(ctx, quota.GrantRequest{Quotas: []string{"hourly"}, Member: "k", Amount: 1})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Equal(t, "3570", httprate.RetryAfter(res))
}
