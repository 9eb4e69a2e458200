//go:build citus

package cli_test

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
)

// counterSum is the sum of the int64 counter name's points whose
// attributes include want.
func counterSum(t *testing.T, rd *sdkmetric.ManualReader, name string, want map[string]string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, rd.Collect(t.Context(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, isSum := m.Data.(metricdata.Sum[int64])
			require.True(t, isSum, "%s is an int64 counter", name)
		points:
			for _, p := range sum.DataPoints {
				for k, v := range want {
					if got, ok := p.Attributes.Value(attribute.Key(k)); !ok || got.AsString() != v {
						continue points
					}
				}
				n += p.Value
			}
		}
	}
	return n
}

// On a Citus coordinator with two workers, the metrics count what the
// calls did: 20 concurrent grants at a limit of 5 are 5 granted and 15
// denied requests and 5 units; a lease's acquire, renewal (with its
// margin) and release; a written and a stale-token fenced write; and a
// relay started with --metrics-addr serves its deliveries, the pending
// gauge (read from the coordinator's outbox) and a healthy /healthz.
func TestCitusMetricsCountWhatTheCallsDid(t *testing.T) {
	c := cituscluster.Start(t, 2)
	db := c.URL()
	ok(t, db, "migrate", "up")
	ctx := t.Context()
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	qc, err := quota.New(c.Pool(), &quota.Config{MeterProvider: mp})
	require.NoError(t, err)
	_, err = qc.DefineQuota(ctx, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: quota.Limit(5)})
	require.NoError(t, err)

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := qc.Grant(ctx, quota.GrantRequest{Quota: "day", Member: "m", Amount: 1}); err != nil {
				t.Errorf("grant %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 5, counterSum(t, rd, "pgquota.grant.requests", map[string]string{"pgquota.outcome": "granted"}))
	require.EqualValues(t, 15, counterSum(t, rd, "pgquota.grant.requests", map[string]string{"pgquota.outcome": "denied"}))
	require.EqualValues(t, 5, counterSum(t, rd, "pgquota.grant.units", nil))

	lc, err := lease.New(qc)
	require.NoError(t, err)
	fc, err := fence.New(qc)
	require.NoError(t, err)
	l, err := lc.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	l, err = lc.Renew(ctx, l, time.Minute)
	require.NoError(t, err)
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "v", Token: l.Token})
	require.NoError(t, err)
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "old", Token: l.Token - 1})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	_, err = lc.Release(ctx, l)
	require.NoError(t, err)
	for outcome, want := range map[string]int64{"acquired": 1, "renewed": 1, "released": 1} {
		require.Equal(t, want, counterSum(t, rd, "pgquota.lease.requests", map[string]string{"pgquota.outcome": outcome}), outcome)
	}
	require.EqualValues(t, 1, counterSum(t, rd, "pgquota.fence.writes", map[string]string{"pgquota.outcome": "written"}))
	require.EqualValues(t, 1, counterSum(t, rd, "pgquota.fence.writes", map[string]string{"pgquota.outcome": "stale_token"}))

	ob, err := outbox.New(qc)
	require.NoError(t, err)
	for range 3 {
		_, err := ob.Enqueue(ctx, "made", []byte(`{}`), nil)
		require.NoError(t, err)
	}
	require.EqualValues(t, 3, counterSum(t, rd, "pgquota.outbox.enqueued", nil))

	relay, _, stderr := startPgquota(t, "--database-url", db, "outbox", "relay", "--metrics-addr", "127.0.0.1:0")
	addr := regexp.MustCompile(`metrics on (http://127\.0\.0\.1:\d+)/metrics`)
	var base string
	require.Eventually(t, func() bool {
		if m := addr.FindStringSubmatch(stderr.String()); m != nil {
			base = m[1]
			return true
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "the relay did not say where it serves: %s", stderr.String())
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `pgquota_outbox_deliveries_total{pgquota_outcome="delivered"} 3`) &&
			strings.Contains(body, "\npgquota_outbox_pending 0\n")
	}, 30*time.Second, 50*time.Millisecond, "relay metrics: %s", func() string { _, b := get("/metrics"); return b }())
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code, body)
	require.NoError(t, relay.Process.Signal(syscall.SIGTERM))
	require.NoError(t, relay.Wait(), stderr.String())
	st, err := ob.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Delivered)
	require.Zero(t, st.Pending)
}
