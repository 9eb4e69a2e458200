package lab

import "go.opentelemetry.io/otel/metric"

// meterProvider is the Config.MeterProvider of the pgquota clients the
// lab creates (SetMeterProvider); nil records nothing.
var meterProvider metric.MeterProvider

// SetMeterProvider makes the pgquota clients that later runs create
// record into mp (`pgquota lab --metrics-addr`). Call it before Run, not
// while one runs.
func SetMeterProvider(mp metric.MeterProvider) { meterProvider = mp }
