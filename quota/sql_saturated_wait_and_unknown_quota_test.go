package quota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// TestSQLFunctionsReportASaturatedWaitInMilliseconds: a rate of one unit
// a century with a burst of 10,000 saturates the library's wait at 2^63-1
// microseconds (TestRateHugeWaitClamped). The public SQL functions grant
// the same request and report that wait rounded up to milliseconds,
// 9223372036854776, instead of failing with 22003 (bigint out of range).
func TestSQLFunctionsReportASaturatedWaitInMilliseconds(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "slow", Window: quota.WindowRate, DefaultLimit: ptr(int64(1)), Period: 36525 * 24 * time.Hour, Burst: 10000})
	const saturated = int64(9223372036854776) // ceil((2^63 - 1) / 1000)

	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "slow", Member: "go", Amount: 10000})
	require.NoError(t, err)
	require.True(t, res.Granted)

	var granted bool
	var resetMs int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT granted, reset_after_ms FROM pgquota.grant('slow', 'sql', 10000)`).Scan(&granted, &resetMs))
	require.True(t, granted)
	require.Equal(t, saturated, resetMs)
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT reset_after_ms FROM pgquota.limit_usage('slow', 'go')`).Scan(&resetMs))
	require.Equal(t, saturated, resetMs)
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT granted, reset_after_ms FROM pgquota.grant_limits(ARRAY['slow'], 'sql2', 10000, NULL)`).Scan(&granted, &resetMs))
	require.True(t, granted)
	require.Equal(t, saturated, resetMs)

	// The rounding itself, at its edges (the owner may call ms_ceil).
	for us, want := range map[int64]int64{-1: -1, 0: 0, 1: 1, 999: 1, 1000: 1, 1001: 2, 9223372036854775807: saturated} {
		var got int64
		require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT pgquota.ms_ceil($1)`, us).Scan(&got))
		require.Equal(t, want, got, "ms_ceil(%d)", us)
	}
}

// TestSQLGrantLimitsRefusesUnknownQuotaAndNullNames: pgquota.grant_limits
// raises PQ010 for a quota that does not exist, as pgquota.grant does
// (never a row a caller could read as a denial), and 22023 for a NULL or
// empty array or a NULL name; nothing is granted to the quotas named
// beside it.
func TestSQLGrantLimitsRefusesUnknownQuotaAndNullNames(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q5", Window: quota.WindowNone, DefaultLimit: ptr(int64(5))})
	cases := []struct {
		name, sql, state string
	}{
		{"unknown quota beside a known one", `SELECT granted FROM pgquota.grant_limits(ARRAY['q5', 'nope'], 'm', 1, NULL)`, "PQ010"},
		{"a NULL name", `SELECT granted FROM pgquota.grant_limits(ARRAY['q5', NULL], 'm', 1, NULL)`, "22023"},
		{"an empty array", `SELECT granted FROM pgquota.grant_limits(ARRAY[]::text[], 'm', 1, NULL)`, "22023"},
		{"a NULL array", `SELECT granted FROM pgquota.grant_limits(NULL, 'm', 1, NULL)`, "22023"},
	}
	for _, c := range cases {
		rows, err := b.pool.Query(b.ctx, c.sql)
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
			err = rows.Err()
		}
		require.Error(t, err, c.name)
		require.Equal(t, c.state, core.SQLState(err), "%s: %v", c.name, err)
	}
	used, _ := b.usageRows(t, "q5", "m")
	require.Zero(t, used, "nothing granted to the known quota")
}
