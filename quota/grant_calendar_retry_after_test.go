package quota_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A calendar grant on its own (pgquota.grant) and the same grant with
// Quotas = [that quota] (pgquota.grant_limits) report RetryAfter and
// ResetAfter with the same meaning: a denial's RetryAfter is the time from
// DecidedAt to the window's end, a granted call's is 0, an amount above the
// limit and a full lifetime counter are Never; ResetAfter is the time to
// the window's end (Never for a lifetime counter).
func TestGrantCalendarRetryAfterMatchesQuotas(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr(int64(2))})
	b.define(t, quota.Definition{Name: "life", Window: quota.WindowNone, DefaultLimit: ptr(int64(1))})

	alone := func(q, m string, n int64) quota.GrantResult {
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: q, Member: m, Amount: n})
		require.NoError(t, err)
		require.False(t, res.DecidedAt.IsZero(), "DecidedAt is set: %+v", res)
		return res
	}
	multi := func(q, m string, n int64) quota.GrantResult {
		res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quotas: []string{q}, Member: m, Amount: n})
		require.NoError(t, err)
		return res
	}
	for name, grant := range map[string]func(q, m string, n int64) quota.GrantResult{"alone": alone, "quotas": multi} {
		m := "m-" + name
		g := grant("day", m, 2)
		toEnd := g.WindowEnd.Sub(g.DecidedAt)
		require.True(t, g.Granted, name)
		require.Zero(t, g.RetryAfter, "%s: granted", name)
		require.Equal(t, toEnd, g.ResetAfter, "%s: reset at the window's end", name)
		require.Positive(t, toEnd)
		require.LessOrEqual(t, toEnd, 24*time.Hour)

		d := grant("day", m, 1)
		require.False(t, d.Granted, name)
		require.Equal(t, d.WindowEnd.Sub(d.DecidedAt), d.RetryAfter, "%s: a denial waits until the window's end", name)
		require.Equal(t, d.RetryAfter, d.ResetAfter, name)

		big := grant("day", m+"-big", 3)
		require.False(t, big.Granted, name)
		require.Equal(t, quota.Never, big.RetryAfter, "%s: 3 units never fit a limit of 2", name)

		require.True(t, grant("life", m, 1).Granted, name)
		full := grant("life", m, 1)
		require.False(t, full.Granted, name)
		require.Equal(t, quota.Never, full.RetryAfter, "%s: a full lifetime counter", name)
		require.Equal(t, quota.Never, full.ResetAfter, "%s: a lifetime counter never resets", name)
	}
}

// statementCounter counts the statements a pool sends.
type statementCounter struct {
	mu  sync.Mutex
	sql []string
}

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, d.SQL)
	return ctx
}

func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The first grant of a rate quota by a Client that has not seen it is one
// statement (pgquota.grant serves every kind; no kind lookup first), and it
// reports the rate's Limits as grant_limits does.
func TestGrantShapedFirstCallOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.define(t, quota.Definition{Name: "r", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Minute, Burst: 3})

	cfg := b.pool.Config() // a copy: the same database and role
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(b.ctx))
	fresh, err := quota.New(pool, testConfig(t, nil))
	require.NoError(t, err)

	counter.mu.Lock()
	counter.sql = nil
	counter.mu.Unlock()
	res, err := fresh.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "m", Amount: 3})
	require.NoError(t, err)
	counter.mu.Lock()
	sent := append([]string(nil), counter.sql...)
	counter.mu.Unlock()
	require.Len(t, sent, 1, "one statement: %q", sent)
	require.Contains(t, sent[0], "pgquota.grant_row(")

	require.True(t, res.Granted)
	require.Zero(t, res.Remaining)
	require.Len(t, res.Limits, 1)
	require.Equal(t, quota.LimitResult{
		Quota: "r", Window: quota.WindowRate, Fits: true, Used: 3, Limit: 5, Remaining: 0, Burst: 3, Period: time.Minute,
		RetryAfter: 0, ResetAfter: res.ResetAfter,
	}, res.Limits[0])
	require.Equal(t, 36*time.Second, res.ResetAfter, "3 units of 12 s each")

	d, err := fresh.Grant(b.ctx, quota.GrantRequest{Quota: "r", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.False(t, d.Granted)
	require.Equal(t, "r", d.DeniedBy)
	require.Positive(t, d.RetryAfter)
	require.LessOrEqual(t, d.RetryAfter, 12*time.Second)
}
