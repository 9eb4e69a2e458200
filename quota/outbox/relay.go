package outbox

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/dbutil"
)

// Handler delivers one outbox event: it publishes it to a broker, calls an
// API, sends the email. A nil error marks the event delivered; an error
// schedules another attempt with backoff, and after RelayConfig.MaxAttempts
// failed attempts the event is dead. A panic counts as an error.
//
// Delivery is at least once: an event is delivered again after a failure,
// and also when the relay stops (crash, cancelled context, lost
// connection) after the handler accepted it but before the relay recorded
// it. Handlers and their consumers dedupe by Event.ID (or pass it on as an
// idempotency key). ctx ends when the relay is stopped.
type Handler func(ctx context.Context, ev Event) error

// RelayConfig configures a Relay. The zero value is ready to use.
type RelayConfig struct {
	// Topics limits the relay to events of these topics. Defaults to every
	// topic.
	Topics []string
	// BatchSize is the number of events claimed per transaction. The
	// claimed rows stay locked while the handler runs, one event after the
	// other, so keep it small for slow handlers. Defaults to 100.
	BatchSize int
	// PollInterval is how long the relay sleeps after finding no event
	// due, before it looks again. Defaults to 1s.
	PollInterval time.Duration
	// MaxAttempts is the number of failed deliveries after which an event
	// is dead (the dead-letter state: kept, counted by Status, never
	// delivered again). Defaults to 10.
	MaxAttempts int
	// RetryInitial and RetryMax bound the wait before the next attempt of a
	// failed event: RetryInitial after the first failure, doubling with
	// every failure up to RetryMax, each randomized by ±50%. The wait is
	// added to the database clock's now. Default to 1s and 10m.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// OnError, when set, is called with the errors Run recovers from (a
	// lost connection, a failed statement) before it tries again. Run
	// never stops for them; it stops when its context ends. Defaults to
	// ignoring them.
	OnError func(error)
}

// Relay delivers outbox events to a Handler. Run several relays at once (in
// one process or many) to deliver in parallel: each claims its own batches
// with FOR UPDATE SKIP LOCKED and keeps them locked while it delivers them,
// so no event is delivered by two relays at the same time. (The claim lasts
// as long as the relay's connection: one that loses it mid-batch stops
// calling its handler, about a millisecond of handler time later at most;
// the event in its handler then may be delivered by another relay at the
// same time.) A relay keeps no cursor: every pending event is claimed
// whenever it is due, so an event whose transaction committed late (after
// events with higher ids were delivered) is delivered too.
//
// Each batch is one transaction at READ COMMITTED, whatever the database's
// default isolation level: the claim's guarantees rest on row locks (and on
// READ COMMITTED re-checking a locked row's newest version), and a batch
// whose handler calls succeeded must not be rolled back by a serialization
// failure. The transaction stays open while the handler runs; a server's
// idle_in_transaction_session_timeout must exceed BatchSize handler calls.
type Relay struct {
	c       *Client
	handler Handler
	cfg     RelayConfig
}

// NewRelay returns a relay that delivers events to h.
//
// Errors: *quota.InputError for a nil handler, a bad topic or a negative or
// inconsistent setting.
func (c *Client) NewRelay(h Handler, cfg RelayConfig) (*Relay, error) {
	if h == nil {
		return nil, core.Invalid("handler", "must not be nil")
	}
	for i, t := range cfg.Topics {
		if err := core.CheckName(fmt.Sprintf("topic %d", i+1), t); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		field string
		v     int64
	}{
		{"RelayConfig.BatchSize", int64(cfg.BatchSize)},
		{"RelayConfig.PollInterval", int64(cfg.PollInterval)},
		{"RelayConfig.MaxAttempts", int64(cfg.MaxAttempts)},
		{"RelayConfig.RetryInitial", int64(cfg.RetryInitial)},
		{"RelayConfig.RetryMax", int64(cfg.RetryMax)},
	} {
		if f.v < 0 {
			return nil, core.Invalid(f.field, "must not be negative, got %d", f.v)
		}
	}
	// BatchSize and MaxAttempts go to the database as 32-bit integers.
	for _, f := range []struct {
		field string
		v     int
	}{{"RelayConfig.BatchSize", cfg.BatchSize}, {"RelayConfig.MaxAttempts", cfg.MaxAttempts}} {
		if int64(f.v) > math.MaxInt32 {
			return nil, core.Invalid(f.field, "must be at most %d, got %d", math.MaxInt32, f.v)
		}
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 100
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.RetryInitial == 0 {
		cfg.RetryInitial = time.Second
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 10 * time.Minute
	}
	if cfg.RetryMax < cfg.RetryInitial {
		return nil, core.Invalid("RelayConfig.RetryMax", "must be at least RetryInitial (%s), got %s", cfg.RetryInitial, cfg.RetryMax)
	}
	if cfg.Topics == nil {
		cfg.Topics = []string{}
	}
	return &Relay{c: c, handler: h, cfg: cfg}, nil
}

// BatchResult counts what one RunOnce did.
type BatchResult struct {
	// Claimed is the number of events claimed; Delivered, Failed (to be
	// retried) and Dead (failed for the last time) split them.
	// Claimed - Delivered - Failed - Dead events were left pending
	// untouched, because the context ended mid-batch.
	Claimed   int `json:"claimed"`
	Delivered int `json:"delivered"`
	Failed    int `json:"failed"`
	Dead      int `json:"dead"`
}

// Run delivers events until ctx ends, then returns nil. It claims one batch
// after the other, and sleeps PollInterval when none is due. Errors (a lost
// connection, say) go to RelayConfig.OnError and are retried with backoff up
// to PollInterval apart; Run does not return them.
func (r *Relay) Run(ctx context.Context) error {
	defer r.c.core.M.ObserveOutbox(r.c.outboxGauges)()
	errWait := &backoff.ExponentialBackOff{
		InitialInterval:     10 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max(r.cfg.PollInterval, 10*time.Millisecond),
	}
	for {
		res, err := r.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err != nil:
			if r.cfg.OnError != nil {
				r.cfg.OnError(err)
			}
			wait = errWait.NextBackOff()
		case res.Claimed == 0:
			errWait.Reset()
			wait = r.cfg.PollInterval
		default:
			errWait.Reset()
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// RunOnce claims one batch of due events, delivers them to the handler one
// after the other, and records the outcomes, in one transaction. It returns
// at once, with a zero result, when no event is due.
//
// When ctx ends mid-batch, the handler is not called again; the outcomes
// so far are still recorded (under context.WithoutCancel, with a short
// timeout) and the rest of the batch stays pending.
//
// A claim that fails because pgx's cached statement went stale (a column
// of pgquota.outbox changed type; see quota.RunInTx) is rolled back and run once
// more after the pool's statement caches were reset; no handler has been
// called by then.
//
// Errors: the context's error before the claim; quota.ErrSchemaMissing; database
// errors. After an error, nothing of the batch was recorded: its events
// stay pending and are delivered again; except after quota.ErrOutcomeUnknown
// (the COMMIT that records the outcomes was sent and no reply came), when
// the outcomes may have been recorded or not: delivery stays at least
// once either way.
func (r *Relay) RunOnce(ctx context.Context) (_ BatchResult, err error) {
	defer r.c.core.M.Done(ctx, core.OpRelayBatch, r.c.core.M.Now(), &err)
	for try := 1; ; try++ {
		tx, err := r.c.core.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			return BatchResult{}, core.DBError("relay", err)
		}
		rows, err := r.c.core.Queries.OutboxClaim(ctx, tx, db.OutboxClaimParams{Topics: r.cfg.Topics, BatchSize: int32(r.cfg.BatchSize)})
		if err != nil {
			dbutil.Rollback(ctx, tx, &err)
			if try == 1 && core.IsStaleStatementError(err) && ctx.Err() == nil {
				if reset := r.c.core.Policy.ResetCaches; reset != nil {
					reset(ctx)
				}
				continue
			}
			return BatchResult{}, core.DBError("relay: claim", err)
		}
		res, err := r.batch(ctx, tx, rows)
		if err != nil {
			dbutil.Rollback(ctx, tx, &err)
			return BatchResult{}, err
		}
		return res, nil
	}
}

// aliveAfter is the handler time after which the relay checks, before the
// next event of a batch, that its connection (and so its claim) still
// holds. Fast handlers go through a batch without the extra round trips;
// a relay that lost its connection calls its handler for at most about
// this long more.
const aliveAfter = time.Millisecond

// recordTimeout bounds recording a batch's outcomes after ctx ended.
const recordTimeout = 5 * time.Second

// batch delivers the claimed rows and records the outcomes in tx.
func (r *Relay) batch(ctx context.Context, tx pgx.Tx, rows []db.OutboxClaimRow) (BatchResult, error) {
	res := BatchResult{Claimed: len(rows)}
	if len(rows) == 0 {
		return res, tx.Commit(ctx)
	}
	var delivered []int64
	var failed db.OutboxMarkFailedParams
	claimed := time.Now() // the claim's reply
	contact := claimed    // the last round trip on tx's connection
	for _, row := range rows {
		if ctx.Err() != nil {
			break
		}
		if time.Since(contact) > aliveAfter {
			// The batch's row locks live as long as this transaction's
			// connection: once it is lost (killed, cut, timed out idle in
			// the transaction), another relay may claim the same events,
			// so the handler must not see them here too. A round trip
			// tells (the event in the handler when the connection died is
			// redelivered: at least once).
			if err := r.alive(ctx, tx); err != nil {
				if ctx.Err() != nil {
					break
				}
				return BatchResult{}, core.DBError("relay: batch lost its connection", err)
			}
			contact = time.Now()
		}
		ev := Event{
			ID:               row.ID,
			Topic:            row.Topic,
			Payload:          row.Payload,
			GrantID:          row.GrantID.Int64,
			IdempotencyScope: row.IdempotencyScope.String,
			IdempotencyKey:   row.IdempotencyKey.String,
			FencingToken:     row.FencingToken.Int64,
			Attempt:          int(row.Attempts) + 1,
			CreatedAt:        core.TimeFromPG(row.CreatedAt),
		}
		if herr := r.call(ctx, ev); herr != nil {
			if ctx.Err() != nil {
				// The relay is stopping, which is likely why the handler
				// failed: leave the event pending without counting an
				// attempt.
				break
			}
			failed.Ids = append(failed.Ids, ev.ID)
			failed.Errors = append(failed.Errors, errorText(herr))
			failed.DelaysUs = append(failed.DelaysUs, r.retryDelay(ev.Attempt).Microseconds())
			if ev.Attempt >= r.cfg.MaxAttempts {
				res.Dead++
			} else {
				res.Failed++
			}
			continue
		}
		delivered = append(delivered, ev.ID)
		res.Delivered++
	}
	// Record what the handler did even when ctx ended meanwhile: the
	// events it accepted would otherwise be delivered again.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if len(delivered) > 0 {
		if _, err := r.c.core.Queries.OutboxMarkDelivered(rctx, tx, delivered); err != nil {
			return BatchResult{}, core.DBError("relay: mark delivered", err)
		}
	}
	if len(failed.Ids) > 0 {
		failed.MaxAttempts = int32(r.cfg.MaxAttempts)
		if _, err := r.c.core.Queries.OutboxMarkFailed(rctx, tx, failed); err != nil {
			return BatchResult{}, core.DBError("relay: mark failed", err)
		}
	}
	if err := tx.Commit(rctx); err != nil {
		return BatchResult{}, core.DBError("relay: commit", dbutil.MarkOutcome(err))
	}
	r.c.core.M.RelayCommitted(ctx, res.Delivered, res.Failed, res.Dead, rows, delivered, claimed)
	return res, nil
}

// alive checks that tx's connection still holds the batch, with a round
// trip that ctx ending does not cut short (pgx would close the connection,
// and with it the outcomes not recorded yet).
func (r *Relay) alive(ctx context.Context, tx pgx.Tx) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	_, err := tx.Exec(pctx, ";")
	return err
}

// call runs the handler, turning a panic into an error.
func (r *Relay) call(ctx context.Context, ev Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = core.Errorf("handler panicked: %v", p)
		}
	}()
	return r.handler(ctx, ev)
}

// retryDelay is the wait after the attempt-th failed delivery: RetryInitial
// doubled per earlier failure, capped at RetryMax, randomized by ±50%
// (computed with backoff's ExponentialBackOff).
func (r *Relay) retryDelay(attempt int) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     r.cfg.RetryInitial,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         r.cfg.RetryMax,
	}
	b.Reset()
	d := b.NextBackOff()
	for i := 1; i < attempt && i < 64; i++ {
		d = b.NextBackOff()
	}
	return d
}

// errorText is a handler error as the outbox stores it (last_error): valid
// UTF-8 without NUL bytes (PostgreSQL text holds neither), at most about
// 2000 bytes.
func errorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > 2000 {
		cut := 2000
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// outboxGauges reads the outbox gauges (core.Metrics.ObserveOutbox).
func (c *Client) outboxGauges(ctx context.Context) (int64, float64, error) {
	row, err := c.core.Queries.OutboxPendingGauge(ctx, c.core.DB.Reads(), core.OutboxGaugeCap)
	if err != nil {
		return 0, 0, core.DBError("outbox gauges", err)
	}
	return row.Pending, row.OldestAgeSeconds, nil
}
