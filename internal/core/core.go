// Package core is the machinery every pgquota client shares, one home each:
// the sentinel errors and the mapping of database errors to them
// (errors.go, db.go), the retry policy and the pool that retries and marks
// unknown outcomes (retry.go), and the OpenTelemetry instruments
// (metrics.go). Package quota's Client and the clients of the capability
// packages (quota/outbox, ...) run on a Core; their public names for these
// (lease.ErrLost, quota.IsRetryable, ...) are re-exports.
package core

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgquota/pgquota/db"
)

// Core is what a client runs its statements on.
type Core struct {
	// Pool is the caller's pool.
	Pool *pgxpool.Pool
	// DB runs single statements on Pool and retries serialization failures
	// and deadlocks; the calls without a Tx suffix use it. Its errors that
	// leave the outcome unknown are marked ErrOutcomeUnknown (SentPool);
	// read-only calls use DB.Reads(), whose errors are not.
	DB RetryPool
	// Queries are the generated statements (package db).
	Queries *db.Queries
	// Policy is how the calls without a Tx suffix retry.
	Policy RetryPolicy
	// M holds the instruments; nil without a MeterProvider.
	M *Metrics
}

// Options are the settings of a Core, from quota.Config.
type Options struct {
	// RetryMaxElapsed bounds the retries of a call (0: DefaultRetryMaxElapsed).
	RetryMaxElapsed time.Duration
	// MeterProvider receives the metrics; nil records nothing.
	MeterProvider metric.MeterProvider
	// MetricsQuotaName adds the quota name to the grant instruments.
	MetricsQuotaName bool
}

// New returns a Core on pool.
//
// Errors: an *InputError naming Config.MeterProvider when its instruments
// cannot be created, or Config.RetryMaxElapsed when it is negative.
func New(pool *pgxpool.Pool, o Options) (*Core, error) {
	if o.RetryMaxElapsed < 0 {
		return nil, Invalid("Config.RetryMaxElapsed", "must not be negative, got %s", o.RetryMaxElapsed)
	}
	if o.RetryMaxElapsed == 0 {
		o.RetryMaxElapsed = DefaultRetryMaxElapsed
	}
	m, err := NewMetrics(o.MeterProvider, o.MetricsQuotaName)
	if err != nil {
		return nil, err
	}
	k := &Core{Pool: pool, Queries: db.New(), M: m}
	k.Policy = RetryPolicy{MaxElapsed: o.RetryMaxElapsed, ResetCaches: CacheResetter(pool), M: m}
	k.DB = RetryPool{Pool: SentPool{Pool: pool}, Policy: k.Policy}
	return k, nil
}
