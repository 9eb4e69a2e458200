package quota

import (
	"context"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// pgquota's OpenTelemetry instruments live in internal/core/metrics.go,
// shared by every package's client; docs/metrics.md lists every instrument
// in one table. A client without Config.MeterProvider records nothing,
// reads no clock and allocates nothing for metrics.

// MeterName is the instrumentation scope pgquota's instruments are created
// under (metric.MeterProvider.Meter).
const MeterName = core.MeterName

// Attribute keys of pgquota's instruments.
const (
	// AttrOperation is the public call: "grant", "grant_tx", "acquire", ...
	AttrOperation = core.AttrOperation
	// AttrOutcome is how the call ended; its values depend on the
	// instrument (docs/metrics.md).
	AttrOutcome = core.AttrOutcome
	// AttrQuota is the quota name, on the grant instruments only when
	// Config.MetricsQuotaName is set.
	AttrQuota = core.AttrQuota
	// AttrPath is what made a multi-request statement: "coalesce" or
	// "batch".
	AttrPath = core.AttrPath
	// AttrSQLState is the SQLSTATE of a retried error (40001 or 40P01).
	AttrSQLState = core.AttrSQLState
)

// grantQuota fills res's quota name from req when it is empty.
func grantQuota(req *GrantRequest, res *GrantResult) {
	if res.Quota == "" {
		res.Quota = req.Quota
	}
}

// grantDone is the metrics hook of Grant, GrantTx and GrantFenced. An
// error's result carries no quota name: it comes from req when quota names
// are recorded.
func (c *Client) grantDone(ctx context.Context, o core.Op, start time.Time, req *GrantRequest, res *GrantResult, err *error) {
	if c.m == nil {
		return
	}
	r := *res
	if c.m.QuotaNames() {
		grantQuota(req, &r)
	}
	c.m.GrantOutcome(ctx, o, r.Quota, r.Granted, r.Replayed, r.Amount, *err)
	c.m.End(ctx, o, start, *err)
}

// batchDone is the metrics hook of GrantBatch and GrantBatchTx: one grant
// request counted per request of the batch, and the batch's size.
func (c *Client) batchDone(ctx context.Context, o core.Op, start time.Time, reqs []GrantRequest, outs *[]BatchOutcome, err *error) {
	if c.m == nil {
		return
	}
	c.m.BatchSize(ctx, len(reqs))
	for i := range reqs {
		var r GrantResult
		e := *err
		if e == nil && i < len(*outs) {
			r, e = (*outs)[i].GrantResult, (*outs)[i].Err
		}
		if c.m.QuotaNames() {
			grantQuota(&reqs[i], &r)
		}
		c.m.GrantOutcome(ctx, o, r.Quota, r.Granted, r.Replayed, r.Amount, e)
	}
	c.m.End(ctx, o, start, *err)
}
