package core

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/dbutil"
)

// This file holds pgquota's OpenTelemetry instruments and the hooks the
// public calls run when they return. The hooks are methods on a *Metrics
// that is nil when Config.MeterProvider is nil: every hook then returns at
// its first line, so a client without a MeterProvider records nothing,
// reads no clock and allocates nothing for metrics.
//
// Names, units and attributes follow the OpenTelemetry semantic
// conventions' style (dotted lower-case names under the pgquota namespace,
// UCUM units, annotations in braces for counts: "{request}"). docs/metrics.md
// lists every instrument in one table; keep it in step.

// MeterName is the instrumentation scope pgquota's instruments are created
// under (metric.MeterProvider.Meter).
const MeterName = "github.com/pgquota/pgquota/quota"

// Attribute keys of pgquota's instruments.
const (
	// AttrOperation is the public call: "grant", "grant_tx", "acquire", ...
	AttrOperation = "pgquota.operation"
	// AttrOutcome is how the call ended; its values depend on the
	// instrument (docs/metrics.md).
	AttrOutcome = "pgquota.outcome"
	// AttrQuota is the quota name, on the grant instruments only when
	// Config.MetricsQuotaName is set.
	AttrQuota = "pgquota.quota"
	// AttrPath is what made a multi-request statement: "coalesce" or
	// "batch".
	AttrPath = "pgquota.path"
	// AttrSQLState is the SQLSTATE of a retried error (40001 or 40P01).
	AttrSQLState = "pgquota.sqlstate"
)

// Op is a public call, the value of AttrOperation.
type Op uint8

const (
	OpGrant Op = iota
	OpGrantTx
	OpGrantBatch
	OpGrantBatchTx
	OpGrantFenced
	OpRevoke
	OpClaim
	OpClaimTx
	OpAcquire
	OpAcquireWait
	OpRenew
	OpRelease
	OpFenceWrite
	OpEnqueue
	OpRelayBatch
	numOps
)

var opNames = [numOps]string{
	OpGrant:        "grant",
	OpGrantTx:      "grant_tx",
	OpGrantBatch:   "grant_batch",
	OpGrantBatchTx: "grant_batch_tx",
	OpGrantFenced:  "grant_fenced",
	OpRevoke:       "revoke",
	OpClaim:        "claim",
	OpClaimTx:      "claim_tx",
	OpAcquire:      "acquire",
	OpAcquireWait:  "acquire_wait",
	OpRenew:        "renew",
	OpRelease:      "release",
	OpFenceWrite:   "fence_write",
	OpEnqueue:      "enqueue",
	OpRelayBatch:   "relay_batch",
}

// Outcomes of the grant requests counter.
const (
	grantGranted = iota
	grantDenied
	grantError
	numGrantOutcomes
)

var grantOutcomes = [numGrantOutcomes]string{"granted", "denied", "error"}

// Outcomes of the lease requests counter.
const (
	leaseAcquired = iota
	leaseHeld
	leaseRenewed
	leaseReleased
	leaseLost
	leaseError
	numLeaseOutcomes
)

var leaseOutcomes = [numLeaseOutcomes]string{"acquired", "held", "renewed", "released", "lost", "error"}

// Outcomes of the fenced writes counter.
const (
	fenceWritten = iota
	fenceStale
	fenceLeaseLost
	fenceError
	numFenceOutcomes
)

var fenceOutcomes = [numFenceOutcomes]string{"written", "stale_token", "lease_lost", "error"}

// Outcomes of the voucher claims counter.
const (
	claimClaimed = iota
	claimRepeat
	claimSoldOut
	claimError
	numClaimOutcomes
)

var claimOutcomes = [numClaimOutcomes]string{"claimed", "repeat", "sold_out", "error"}

// Outcomes of the outbox deliveries counter.
const (
	deliveryDelivered = iota
	deliveryFailed
	deliveryDead
	numDeliveryOutcomes
)

var deliveryOutcomes = [numDeliveryOutcomes]string{"delivered", "failed", "dead"}

// Outcomes of the retries counter.
const (
	retrySucceeded = iota
	retryFailed
	retryExhausted
	numRetryOutcomes
)

var retryOutcomes = [numRetryOutcomes]string{"succeeded", "failed", "exhausted"}

// Paths of the statement size histogram.
const (
	PathCoalesce = iota
	PathBatch
	PathGroup
	numPaths
)

var pathNames = [numPaths]string{"coalesce", "batch", "group"}

// Seconds buckets for the latency histograms: 0.5ms to 10s.
var secondsBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Seconds buckets for the outbox delivery latency: 1ms to 10 minutes (an
// outbox may lag by minutes).
var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600}

// Size buckets for the statement size histogram.
var sizeBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// Metrics holds the instruments of a client with a MeterProvider, and the
// measurement options of every attribute combination, built once, so that a
// recording allocates no attribute set (unless quota names are recorded).
type Metrics struct {
	quotaName bool

	grantRequests  metric.Int64Counter
	grantUnits     metric.Int64Counter
	statementSize  metric.Int64Histogram
	retries        metric.Int64Counter
	fenceWrites    metric.Int64Counter
	leaseRequests  metric.Int64Counter
	renewMargin    metric.Float64Histogram
	keeperExpired  metric.Int64Counter
	claims         metric.Int64Counter
	enqueued       metric.Int64Counter
	deliveries     metric.Int64Counter
	deliveryAge    metric.Float64Histogram
	outcomeUnknown metric.Int64Counter
	duration       metric.Float64Histogram
	meter          metric.Meter

	grantOpts    [numOps][numGrantOutcomes][]metric.AddOption
	leaseOpts    [numOps][numLeaseOutcomes][]metric.AddOption
	fenceOpts    [numFenceOutcomes][]metric.AddOption
	claimOpts    [numOps][numClaimOutcomes][]metric.AddOption
	deliverOpts  [numDeliveryOutcomes][]metric.AddOption
	retryOpts    [numRetryOutcomes][2][]metric.AddOption // [outcome][0: 40001, 1: 40P01]
	pathOpts     [numPaths][]metric.RecordOption
	unknownOpts  [numOps][]metric.AddOption
	durationOpts [numOps][2][]metric.RecordOption // [op][0: ok, 1: error]
}

// NewMetrics returns the instruments of p, or nil when p is nil. quotaName
// adds the quota name to the grant instruments (quota.Config's
// MetricsQuotaName).
func NewMetrics(p metric.MeterProvider, quotaName bool) (*Metrics, error) {
	if p == nil {
		return nil, nil
	}
	mt := p.Meter(MeterName)
	m := &Metrics{quotaName: quotaName, meter: mt}
	var errs []error
	i64 := func(name, unit, desc string) metric.Int64Counter {
		c, err := mt.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	f64h := func(name, unit, desc string, buckets []float64) metric.Float64Histogram {
		h, err := mt.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	m.grantRequests = i64("pgquota.grant.requests", "{request}", "Grant requests decided, by operation and outcome (granted, denied, error).")
	m.grantUnits = i64("pgquota.grant.units", "{unit}", "Units granted (replayed outcomes of idempotency keys not counted again).")
	var err error
	m.statementSize, err = mt.Int64Histogram("pgquota.grant.statement.size", metric.WithUnit("{request}"),
		metric.WithDescription("Grant requests decided by one statement: a coalesced statement, or a GrantBatch call."),
		metric.WithExplicitBucketBoundaries(sizeBuckets...))
	errs = append(errs, err)
	m.retries = i64("pgquota.retries", "{retry}", "Runs again of a statement or transaction after a serialization failure or deadlock, by the SQLSTATE and how the call ended (succeeded, failed, exhausted).")
	m.fenceWrites = i64("pgquota.fence.writes", "{write}", "Fenced writes by outcome (written, stale_token, lease_lost, error).")
	m.leaseRequests = i64("pgquota.lease.requests", "{request}", "Lease calls by operation and outcome (acquired, held, renewed, released, lost, error).")
	m.renewMargin = f64h("pgquota.lease.renewal.margin", "s", "Time the lease had left, by the database clock, when a renewal took its row lock.", secondsBuckets)
	m.keeperExpired = i64("pgquota.lease.keepalive.expired", "{lease}", "Keepalives that cancelled their holder's context because no renewal was confirmed before the expiry margin.")
	m.claims = i64("pgquota.voucher.claims", "{claim}", "Voucher claims by operation and outcome (claimed, repeat, sold_out, error).")
	m.enqueued = i64("pgquota.outbox.enqueued", "{event}", "Outbox events written (Enqueue, EnqueueTx; an EnqueueTx whose transaction rolled back is counted too).")
	m.deliveries = i64("pgquota.outbox.deliveries", "{event}", "Outbox delivery attempts committed by a relay, by outcome (delivered, failed, dead).")
	m.deliveryAge = f64h("pgquota.outbox.delivery.latency", "s", "Time from an event's enqueue to the commit of its delivery: its age by the database clock at the claim plus the relay's time since.", latencyBuckets)
	m.outcomeUnknown = i64("pgquota.outcome_unknown", "{error}", "Calls that returned ErrOutcomeUnknown (sent, no reply), by operation.")
	m.duration = f64h("pgquota.operation.duration", "s", "Duration of public calls, by operation and outcome (ok, error).", secondsBuckets)
	if err := errors.Join(errs...); err != nil {
		return nil, Invalid("Config.MeterProvider", "creating instruments: %v", err)
	}

	opAttr := func(o Op) attribute.KeyValue { return attribute.String(AttrOperation, opNames[o]) }
	add := func(kv ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	}
	rec := func(kv ...attribute.KeyValue) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	}
	for o := range numOps {
		for g := range numGrantOutcomes {
			m.grantOpts[o][g] = add(opAttr(o), attribute.String(AttrOutcome, grantOutcomes[g]))
		}
		for l := range numLeaseOutcomes {
			m.leaseOpts[o][l] = add(opAttr(o), attribute.String(AttrOutcome, leaseOutcomes[l]))
		}
		for c := range numClaimOutcomes {
			m.claimOpts[o][c] = add(opAttr(o), attribute.String(AttrOutcome, claimOutcomes[c]))
		}
		m.unknownOpts[o] = add(opAttr(o))
		m.durationOpts[o][0] = rec(opAttr(o), attribute.String(AttrOutcome, "ok"))
		m.durationOpts[o][1] = rec(opAttr(o), attribute.String(AttrOutcome, "error"))
	}
	for f := range numFenceOutcomes {
		m.fenceOpts[f] = add(attribute.String(AttrOutcome, fenceOutcomes[f]))
	}
	for d := range numDeliveryOutcomes {
		m.deliverOpts[d] = add(attribute.String(AttrOutcome, deliveryOutcomes[d]))
	}
	for r := range numRetryOutcomes {
		for i, code := range [2]string{"40001", "40P01"} {
			m.retryOpts[r][i] = add(attribute.String(AttrOutcome, retryOutcomes[r]), attribute.String(AttrSQLState, code))
		}
	}
	for p := range numPaths {
		m.pathOpts[p] = rec(attribute.String(AttrPath, pathNames[p]))
	}
	return m, nil
}

// Now returns the start time of a call, or the zero time without metrics
// (no clock read).
func (m *Metrics) Now() time.Time {
	if m == nil {
		return time.Time{}
	}
	return time.Now()
}

// End records a call's duration and, when err says so, that its outcome is
// unknown. Every hook below calls it.
func (m *Metrics) End(ctx context.Context, o Op, start time.Time, err error) {
	if m == nil {
		return
	}
	failed := 0
	if err != nil {
		failed = 1
		if errors.Is(err, dbutil.ErrOutcomeUnknown) {
			m.outcomeUnknown.Add(ctx, 1, m.unknownOpts[o]...)
		}
	}
	m.duration.Record(ctx, time.Since(start).Seconds(), m.durationOpts[o][failed]...)
}

// Done is the hook of calls that have no outcome counter of their own
// (Revoke, Enqueue...): duration, outcome unknown, and for Enqueue the
// events written.
func (m *Metrics) Done(ctx context.Context, o Op, start time.Time, err *error) {
	if m == nil {
		return
	}
	if o == OpEnqueue && *err == nil {
		m.enqueued.Add(ctx, 1)
	}
	m.End(ctx, o, start, *err)
}

// GrantOutcome counts one decided grant request of operation o: granted or
// denied (err nil), or failed; amount is counted as granted units unless
// the outcome was replayed. quota is recorded when quota names are.
func (m *Metrics) GrantOutcome(ctx context.Context, o Op, quota string, granted, replayed bool, amount int64, err error) {
	if m == nil {
		return
	}
	g := grantDenied
	switch {
	case err != nil:
		g = grantError
	case granted:
		g = grantGranted
	}
	if !m.quotaName {
		m.grantRequests.Add(ctx, 1, m.grantOpts[o][g]...)
		if g == grantGranted && !replayed {
			m.grantUnits.Add(ctx, amount)
		}
		return
	}
	q := attribute.String(AttrQuota, quota)
	m.grantRequests.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrOperation, opNames[o]), attribute.String(AttrOutcome, grantOutcomes[g]), q))
	if g == grantGranted && !replayed {
		m.grantUnits.Add(ctx, amount, metric.WithAttributes(q))
	}
}

// QuotaNames reports whether the grant instruments record quota names.
func (m *Metrics) QuotaNames() bool { return m != nil && m.quotaName }

// BatchSize records the number of requests of a GrantBatch call.
func (m *Metrics) BatchSize(ctx context.Context, n int) {
	if m == nil {
		return
	}
	m.statementSize.Record(ctx, int64(n), m.pathOpts[PathBatch]...)
}

// StatementSizeOf records the number of grant requests one statement of
// path decided: the hook of code that decides many calls in one statement
// (the coalescer: PathCoalesce; GrantBatch records its own, PathBatch).
// Add a path (pathNames) for another such code path.
func (m *Metrics) StatementSizeOf(ctx context.Context, path int, n int) {
	if m == nil {
		return
	}
	m.statementSize.Record(ctx, int64(n), m.pathOpts[path]...)
}

// LeaseDone is the hook of Acquire, AcquireTx, AcquireWait, Renew (and
// RenewTx, and the keepalive's renewals), Release and ReleaseTx.
func (m *Metrics) LeaseDone(ctx context.Context, o Op, start time.Time, err *error) {
	if m == nil {
		return
	}
	e := *err
	l := leaseError
	switch {
	case e == nil && (o == OpAcquire || o == OpAcquireWait):
		l = leaseAcquired
	case e == nil && o == OpRenew:
		l = leaseRenewed
	case e == nil:
		l = leaseReleased
	case errors.Is(e, ErrLeaseHeld):
		l = leaseHeld
	case errors.Is(e, ErrLeaseLost):
		l = leaseLost
	}
	m.leaseRequests.Add(ctx, 1, m.leaseOpts[o][l]...)
	m.End(ctx, o, start, e)
}

// Renewed records the renewal margin: the lease's expiry before the renewal
// minus the database clock when the renewal held its row lock.
func (m *Metrics) Renewed(ctx context.Context, prevExpiry, dbNow pgtype.Timestamptz) {
	if m == nil || !prevExpiry.Valid || !dbNow.Valid {
		return
	}
	m.renewMargin.Record(ctx, prevExpiry.Time.Sub(dbNow.Time).Seconds())
}

// KeepaliveExpired counts a keepalive that cancelled its holder.
func (m *Metrics) KeepaliveExpired() {
	if m == nil {
		return
	}
	m.keeperExpired.Add(context.Background(), 1)
}

// FenceDone is the hook of fence.Client.WriteRow and WriteRowTx.
func (m *Metrics) FenceDone(ctx context.Context, start time.Time, err *error) {
	if m == nil {
		return
	}
	e := *err
	f := fenceError
	switch {
	case e == nil:
		f = fenceWritten
	case errors.Is(e, ErrStaleToken):
		f = fenceStale
	case errors.Is(e, ErrLeaseLost):
		f = fenceLeaseLost
	}
	m.fenceWrites.Add(ctx, 1, m.fenceOpts[f]...)
	m.End(ctx, OpFenceWrite, start, e)
}

// ClaimDone is the hook of the voucher claims.
func (m *Metrics) ClaimDone(ctx context.Context, o Op, start time.Time, repeat, claimed bool, err *error) {
	if m == nil {
		return
	}
	k := claimError
	switch {
	case *err != nil:
	case repeat:
		k = claimRepeat
	case claimed:
		k = claimClaimed
	default:
		k = claimSoldOut
	}
	m.claims.Add(ctx, 1, m.claimOpts[o][k]...)
	m.End(ctx, o, start, *err)
}

// Retried records n runs again of a call that retry made, by the SQLSTATE
// of the first retried error and how the call ended.
func (m *Metrics) Retried(ctx context.Context, n int, first, last error) {
	if m == nil || n == 0 {
		return
	}
	code := 0
	if SQLState(first) == "40P01" {
		code = 1
	}
	r := retrySucceeded
	switch {
	case last == nil:
	case IsRetryable(last):
		r = retryExhausted
	default:
		r = retryFailed
	}
	m.retries.Add(ctx, int64(n), m.retryOpts[r][code]...)
}

// RelayCommitted is the relay's hook after a batch committed: its
// deliveries by outcome, and each delivered event's latency (its age by
// the database clock when it was claimed, plus the relay's time since
// claimed, the claim's reply). delivered lists the delivered events' ids in
// the order of rows.
func (m *Metrics) RelayCommitted(ctx context.Context, nDelivered, nFailed, nDead int, rows []db.OutboxClaimRow, delivered []int64, claimed time.Time) {
	if m == nil {
		return
	}
	for d, n := range [numDeliveryOutcomes]int{nDelivered, nFailed, nDead} {
		if n > 0 {
			m.deliveries.Add(ctx, int64(n), m.deliverOpts[d]...)
		}
	}
	since := time.Since(claimed)
	i := 0
	for _, r := range rows {
		if i == len(delivered) {
			break
		}
		if r.ID != delivered[i] {
			continue
		}
		i++
		if r.DbNow.Valid && r.CreatedAt.Valid {
			m.deliveryAge.Record(ctx, (r.DbNow.Time.Sub(r.CreatedAt.Time) + since).Seconds())
		}
	}
}

// ObserveOutbox registers, while a Relay runs, the outbox gauges: pending
// events and the oldest pending event's age, read by one bounded query at
// each collection (read: at most OutboxGaugeCap events are counted,
// through the pending index). The returned function unregisters
// them.
func (m *Metrics) ObserveOutbox(read func(ctx context.Context) (pending int64, oldestAge float64, err error)) func() {
	if m == nil {
		return func() {}
	}
	pending, err1 := m.meter.Int64ObservableGauge("pgquota.outbox.pending", metric.WithUnit("{event}"),
		metric.WithDescription("Outbox events waiting for delivery (counted up to 1000000), read at collection while a relay runs."))
	oldest, err2 := m.meter.Float64ObservableGauge("pgquota.outbox.oldest_pending.age", metric.WithUnit("s"),
		metric.WithDescription("Age by the database clock of the oldest pending outbox event (the lowest id), 0 when none is pending."))
	if err1 != nil || err2 != nil {
		return func() {}
	}
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		qctx, cancel := context.WithTimeout(ctx, outboxGaugeTimeout)
		defer cancel()
		n, age, err := read(qctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(pending, n)
		o.ObserveFloat64(oldest, age)
		return nil
	}, pending, oldest)
	if err != nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// The outbox gauges' query bounds.
const (
	OutboxGaugeCap     = 1000000
	outboxGaugeTimeout = 2 * time.Second
)
