package quota_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgquota/pgquota/quota"
)

// meter is one replica's MeterProvider with a reader the test collects from.
type meter struct {
	provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

func newMeter(t *testing.T) *meter {
	t.Helper()
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &meter{provider: mp, reader: rd}
}

// meteredClient returns a client on the bundle's pool (a replica) that
// records into a new meter; cfg may be nil.
func (b *testBundle) meteredClient(t *testing.T, cfg *quota.Config) (*quota.Client, *meter) {
	t.Helper()
	m := newMeter(t)
	var c quota.Config
	if cfg != nil {
		c = *cfg
	}
	c.MeterProvider = m.provider
	client, err := quota.New(b.pool, testConfig(t, &c))
	require.NoError(t, err)
	return client, m
}

func (m *meter) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(context.Background(), &rm))
	return rm
}

// find returns the instrument name's data, or nil.
func find(rm metricdata.ResourceMetrics, name string) *metricdata.Metrics {
	for _, sm := range rm.ScopeMetrics {
		for i := range sm.Metrics {
			if sm.Metrics[i].Name == name {
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

// matches reports whether set has every attribute of want.
func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.AsString() != v {
			return false
		}
	}
	return true
}

// sumOf returns the sum of the int64 counter name's points whose attributes
// include want, over every meter given.
func sumOf(t *testing.T, name string, want map[string]string, ms ...*meter) int64 {
	t.Helper()
	var n int64
	for _, m := range ms {
		md := find(m.collect(t), name)
		if md == nil {
			continue
		}
		switch d := md.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				if matches(p.Attributes, want) {
					n += p.Value
				}
			}
		case metricdata.Gauge[int64]:
			for _, p := range d.DataPoints {
				if matches(p.Attributes, want) {
					n += p.Value
				}
			}
		case metricdata.Histogram[int64]:
			for _, p := range d.DataPoints {
				if matches(p.Attributes, want) {
					n += p.Sum
				}
			}
		default:
			t.Fatalf("%s: unexpected data %T", name, md.Data)
		}
	}
	return n
}

// histOf returns the count and sum of the float64 histogram name's points
// whose attributes include want, over every meter given.
func histOf(t *testing.T, name string, want map[string]string, ms ...*meter) (count uint64, sum float64) {
	t.Helper()
	for _, m := range ms {
		md := find(m.collect(t), name)
		if md == nil {
			continue
		}
		switch d := md.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				if matches(p.Attributes, want) {
					count += p.Count
					sum += p.Sum
				}
			}
		case metricdata.Histogram[int64]:
			for _, p := range d.DataPoints {
				if matches(p.Attributes, want) {
					count += p.Count
					sum += float64(p.Sum)
				}
			}
		default:
			t.Fatalf("%s: unexpected data %T", name, md.Data)
		}
	}
	return count, sum
}

// attrKeys returns the attribute keys of every point of name.
func attrKeys(t *testing.T, m *meter, name string) map[string]bool {
	t.Helper()
	keys := map[string]bool{}
	md := find(m.collect(t), name)
	require.NotNil(t, md, "no data for %s", name)
	d, ok := md.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s: %T", name, md.Data)
	for _, p := range d.DataPoints {
		for _, kv := range p.Attributes.ToSlice() {
			keys[string(kv.Key)] = true
		}
	}
	return keys
}

// gaugeFloat returns the value of the float64 gauge name (one point).
func gaugeFloat(t *testing.T, m *meter, name string) float64 {
	t.Helper()
	md := find(m.collect(t), name)
	require.NotNil(t, md, "no data for %s", name)
	d, ok := md.Data.(metricdata.Gauge[float64])
	require.True(t, ok, "%s: %T", name, md.Data)
	require.Len(t, d.DataPoints, 1)
	return d.DataPoints[0].Value
}
