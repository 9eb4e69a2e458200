package quota_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// BenchmarkGrantMetrics is BenchmarkGrant's hot-row case with and without
// a MeterProvider (the OpenTelemetry SDK with a reader, as an application
// exporting to Prometheus has): the difference in grants/s and allocs/op is
// what metrics cost a grant. The cases alternate within one run; compare
// the pairs (benchstat, or one run's ratio):
//
//	go test ./quota -run '^$' -bench GrantMetrics -benchtime 3s -count 3
func BenchmarkGrantMetrics(b *testing.B) {
	ctx := context.Background()
	url := pgtest.NewURL(b)
	setupPool := pgtest.ConnectOperator(b, url, 2)
	setup, err := quota.New(setupPool, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := setup.DefineQuota(ctx, quota.Definition{Name: "bench", Window: quota.WindowDay}); err != nil {
		b.Fatal(err)
	}
	for _, clients := range []int{1, 8} {
		for _, metered := range []bool{false, true} {
			name := "meter=none"
			if metered {
				name = "meter=sdk"
			}
			b.Run(fmt.Sprintf("%s/clients=%d", name, clients), func(b *testing.B) {
				pool := pgtest.Connect(b, url, int32(clients))
				cfg := &quota.Config{}
				if metered {
					mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
					b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
					cfg.MeterProvider = mp
				}
				client, err := quota.New(pool, cfg)
				if err != nil {
					b.Fatal(err)
				}
				limit := quota.MaxUnits
				req := quota.GrantRequest{Quota: "bench", Member: "hot", Amount: 1, Limit: &limit}
				if _, err := client.Grant(ctx, req); err != nil { // connect, create the series
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				var next atomic.Int64
				var wg sync.WaitGroup
				for range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							if _, err := client.Grant(ctx, req); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
			})
		}
	}
}
