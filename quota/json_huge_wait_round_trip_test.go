package quota_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A rate quota's wait saturates at math.MaxInt64 (TestRateHugeWaitClamped:
// ~292 years) instead of wrapping. Its JSON is that wait in whole
// milliseconds rounded up, 9223372036855, and decoding it must give a wait
// at least as long back (saturated), not a negative Duration: a negative
// wait reads as "retry now" or, compared with Never, as neither a wait nor
// Never. The same for every result that carries a wait.
func TestJSONSaturatedWaitDecodesToSaturatedWaitNotNegative(t *testing.T) {
	t.Parallel()
	huge := time.Duration(math.MaxInt64)

	b, err := json.Marshal(quota.GrantResult{Granted: true, ResetAfter: huge, Limits: []quota.LimitResult{{ResetAfter: huge, RetryAfter: huge}}})
	require.NoError(t, err)
	t.Logf("GrantResult JSON: %s", b)
	var g quota.GrantResult
	require.NoError(t, json.Unmarshal(b, &g))
	require.Equal(t, huge, g.ResetAfter, "GrantResult.ResetAfter after a round trip of %s", b)
	require.Equal(t, huge, g.Limits[0].ResetAfter, "LimitResult.ResetAfter after a round trip")
	require.Equal(t, huge, g.Limits[0].RetryAfter, "LimitResult.RetryAfter after a round trip")

	b, err = json.Marshal(quota.Usage{ResetAfter: huge, RefillAfter: huge})
	require.NoError(t, err)
	var u quota.Usage
	require.NoError(t, json.Unmarshal(b, &u))
	require.Equal(t, huge, u.ResetAfter, "Usage.ResetAfter after a round trip of %s", b)
	require.Equal(t, huge, u.RefillAfter, "Usage.RefillAfter after a round trip of %s", b)
}

// A wait in milliseconds beyond what a Duration holds (from another
// producer, or a hand-written document) decodes to a non-negative wait,
// never to a wrapped negative one that is not Never either.
func TestJSONWaitBeyondDurationRangeDoesNotWrapNegative(t *testing.T) {
	t.Parallel()
	var g quota.GrantResult
	require.NoError(t, json.Unmarshal([]byte(`{"granted":false,"retry_after_ms":10000000000000,"reset_after_ms":-1}`), &g))
	t.Logf("retry_after_ms 1e13 decodes to RetryAfter %d (%s)", int64(g.RetryAfter), g.RetryAfter)
	require.Equal(t, quota.Never, g.ResetAfter)
	require.GreaterOrEqual(t, g.RetryAfter, time.Duration(0), "a wait of 1e13 ms is a (long) wait, not negative")
}
