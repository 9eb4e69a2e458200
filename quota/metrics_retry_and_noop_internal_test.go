package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func internalMeter(t *testing.T, cfg Config) (*core.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	cfg.MeterProvider = mp
	m, err := core.NewMetrics(cfg.MeterProvider, cfg.MetricsQuotaName)
	require.NoError(t, err)
	return m, rd
}

func counter(t *testing.T, rd *sdkmetric.ManualReader, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, rd.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name != name {
				continue
			}
			for _, p := range md.Data.(metricdata.Sum[int64]).DataPoints {
				ok := true
				for _, kv := range want {
					v, has := p.Attributes.Value(kv.Key)
					ok = ok && has && v == kv.Value
				}
				if ok {
					n += p.Value
				}
			}
		}
	}
	return n
}

// retry counts each run again, by the first retried SQLSTATE and by how
// the call ended; a call that succeeds at once counts nothing.
func TestRetryMetricsCountRunsAgainByOutcome(t *testing.T) {
	t.Parallel()
	m, rd := internalMeter(t, Config{})
	p := core.RetryPolicy{MaxElapsed: time.Minute, M: m}
	ctx := context.Background()
	fails := func(codes ...string) func() (int, error) {
		i := 0
		return func() (int, error) {
			if i < len(codes) {
				i++
				if codes[i-1] == "boom" {
					return 0, errors.New("boom")
				}
				return 0, &pgconn.PgError{Code: codes[i-1]}
			}
			return 1, nil
		}
	}
	_, err := core.Retry(ctx, p, fails())
	require.NoError(t, err)
	_, err = core.Retry(ctx, p, fails("40001", "40001", "40001"))
	require.NoError(t, err)
	_, err = core.Retry(ctx, p, fails("40P01", "boom"))
	require.EqualError(t, err, "boom")
	short := core.RetryPolicy{MaxElapsed: 20 * time.Millisecond, M: m}
	_, err = core.Retry(ctx, short, func() (int, error) { return 0, &pgconn.PgError{Code: "40001"} })
	require.True(t, IsRetryable(err))

	outcome := func(o, code string) int64 {
		return counter(t, rd, "pgquota.retries", attribute.String(AttrOutcome, o), attribute.String(AttrSQLState, code))
	}
	require.Equal(t, int64(3), outcome("succeeded", "40001"))
	require.Equal(t, int64(1), outcome("failed", "40P01"))
	require.Positive(t, outcome("exhausted", "40001"))
	require.Equal(t, int64(0), outcome("succeeded", "40P01"))
}

// Without a MeterProvider the hooks allocate nothing and read no clock.
func TestMetricsHooksAllocateNothingWithoutMeterProvider(t *testing.T) {
	var m *core.Metrics
	ctx := context.Background()
	req := GrantRequest{Quota: "q", Member: "m", Amount: 1}
	var res GrantResult
	var err error
	var outs []BatchOutcome
	c := &Client{m: m}
	allocs := testing.AllocsPerRun(100, func() {
		start := m.Now()
		if !start.IsZero() {
			t.Fatal("clock read without metrics")
		}
		c.grantDone(ctx, core.OpGrant, start, &req, &res, &err)
		c.batchDone(ctx, core.OpGrantBatch, start, []GrantRequest{req}, &outs, &err)
		m.LeaseDone(ctx, core.OpRenew, start, &err)
		m.FenceDone(ctx, start, &err)
		m.ClaimDone(ctx, core.OpClaim, start, false, true, &err)
		m.Done(ctx, core.OpEnqueue, start, &err)
		m.StatementSizeOf(ctx, core.PathCoalesce, 3)
		m.Retried(ctx, 2, nil, nil)
		m.KeepaliveExpired()
	})
	require.Zero(t, allocs)
}

// With a MeterProvider, recording a granted or denied Grant (quota names
// off) costs at most 2 allocations.
func TestMetricsGrantHookAllocatesAtMostTwo(t *testing.T) {
	m, _ := internalMeter(t, Config{})
	ctx := context.Background()
	req := GrantRequest{Quota: "q", Member: "m", Amount: 1}
	res := GrantResult{Granted: true, Quota: "q", Amount: 1}
	var err error
	c := &Client{m: m}
	c.grantDone(ctx, core.OpGrant, m.Now(), &req, &res, &err) // the series exist
	allocs := testing.AllocsPerRun(200, func() {
		c.grantDone(ctx, core.OpGrant, m.Now(), &req, &res, &err)
	})
	require.LessOrEqual(t, allocs, 2.0)
}

// BenchmarkMetricsGrantHook measures the hook a Grant runs when it returns,
// without the database: with no MeterProvider (nil) and with the SDK. Set
// beside BenchmarkGrantMetrics's time per grant it is the CPU that metrics
// add to a grant, without the noise of a shared machine's disk.
func BenchmarkMetricsGrantHook(b *testing.B) {
	for _, metered := range []bool{false, true} {
		name := "meter=none"
		if metered {
			name = "meter=sdk"
		}
		b.Run(name, func(b *testing.B) {
			var m *core.Metrics
			if metered {
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
				var err error
				if m, err = core.NewMetrics(mp, false); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			req := GrantRequest{Quota: "q", Member: "m", Amount: 1}
			res := GrantResult{Granted: true, Quota: "q", Amount: 1}
			var err error
			c := &Client{m: m}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.grantDone(ctx, core.OpGrant, m.Now(), &req, &res, &err)
				}
			})
		})
	}
}
