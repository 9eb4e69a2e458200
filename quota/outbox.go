package quota

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// The transactional outbox (Chris Richardson, "Pattern: Transactional
// outbox", microservices.io): an event that reports a change is written to
// a table in the same transaction as the change, so the event exists if and
// only if the change committed. A Relay then delivers it to the outside
// world (a message broker, an email or payment API) at least once.

// EnqueueOpts stamps an outbox event with the operation it reports. Every
// field is optional; a nil *EnqueueOpts stamps nothing.
type EnqueueOpts struct {
	// GrantID is the ledger grant id of the operation (Keyed.GrantID), so
	// the consumer can tell which grant the event belongs to, and
	// compensate it (CompensateGrant) when the side effect fails for good.
	GrantID int64
	// IdempotencyScope and IdempotencyKey are the operation's idempotency
	// key, for consumers that pass it on to an API that dedupes by key.
	IdempotencyScope string
	IdempotencyKey   string
	// FencingToken is the lease token the work ran under, when it ran
	// under a lease, so that a consumer can reject events from a deposed
	// holder (the highest token it has seen wins). 0 means none.
	FencingToken int64
}

// Event is an outbox event as a relay delivers it.
type Event struct {
	// ID is the event's stable id: it stays the same across redeliveries,
	// so consumers dedupe on it. It is unique within the database and
	// increases in the order events were enqueued (not committed).
	ID      int64  `json:"id"`
	Topic   string `json:"topic"`
	Payload []byte `json:"payload"`
	// GrantID, IdempotencyScope, IdempotencyKey and FencingToken are the
	// EnqueueOpts the event was written with (zero when not set).
	GrantID          int64  `json:"grant_id"`
	IdempotencyScope string `json:"idempotency_scope"`
	IdempotencyKey   string `json:"idempotency_key"`
	FencingToken     int64  `json:"fencing_token"`
	// Attempt is the delivery attempt, 1 for the first. A redelivery after a
	// handler failure has a higher Attempt; after a relay crashed mid-batch
	// the same Attempt can be delivered again.
	Attempt   int       `json:"attempt"`
	CreatedAt time.Time `json:"created_at"`
}

// EnqueueTx writes an event to the outbox inside the caller's transaction,
// typically the one that ran GrantTx: the event becomes visible to relays
// when tx commits, and vanishes if it rolls back, so it is sent if and only
// if the grant stands. topic names the kind of event (1 to MaxNameBytes
// bytes, no control characters); payload is delivered as is (JSON,
// protobuf, ...). It returns the event's id.
//
// A grant and the event that reports it, committed together, retried as a
// whole on a serialization failure:
//
//	err := quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//		g, err := client.GrantTx(ctx, tx, quota.GrantRequest{
//			Quota: "points", Member: "alice", Amount: 50,
//			Idempotency: quota.IdempotencyKey{Key: orderID},
//		})
//		if err != nil || !g.Granted || g.Replayed {
//			return err
//		}
//		_, err = client.EnqueueTx(ctx, tx, "points.granted", payload, &quota.EnqueueOpts{
//			GrantID: g.GrantID, IdempotencyScope: g.IdempotencyScope, IdempotencyKey: g.IdempotencyKey,
//		})
//		return err
//	})
//
// A replayed grant (g.Replayed: the key's first call committed, with its
// event) enqueues nothing: a second event would have another id, and
// consumers that dedupe by event id would act twice.
//
// A Relay's Handler then sends the event; if the side effect fails for
// good, it compensates with CompensateGrant(ctx, ev.GrantID).
//
// Errors: *InputError for a bad topic or opts; ErrSchemaMissing; database
// errors, returned unchanged (a serialization failure included, as for
// GrantTx).
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, topic string, payload []byte, opts *EnqueueOpts) (_ int64, err error) {
	defer c.m.Done(ctx, core.OpEnqueue, c.m.Now(), &err)
	return c.enqueue(ctx, tx, topic, payload, opts)
}

// Enqueue writes an event to the outbox in a transaction of its own. Use
// EnqueueTx to tie the event to other writes.
//
// Errors: as for EnqueueTx.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, read the outbox (OutboxEvents); a blind
// repeat may enqueue the event twice (consumers dedupe by IdempotencyKey
// when set).
func (c *Client) Enqueue(ctx context.Context, topic string, payload []byte, opts *EnqueueOpts) (_ int64, err error) {
	defer c.m.Done(ctx, core.OpEnqueue, c.m.Now(), &err)
	return c.enqueue(ctx, c.db, topic, payload, opts)
}

func (c *Client) enqueue(ctx context.Context, x db.DBTX, topic string, payload []byte, opts *EnqueueOpts) (int64, error) {
	if err := core.CheckName("topic", topic); err != nil {
		return 0, err
	}
	if payload == nil {
		payload = []byte{}
	}
	p := db.OutboxEnqueueParams{Topic: topic, Payload: payload}
	if opts != nil {
		if opts.GrantID < 0 {
			return 0, core.Invalid("grant id", "must not be negative, got %d", opts.GrantID)
		}
		if opts.FencingToken < 0 {
			return 0, core.Invalid("fencing token", "must not be negative, got %d", opts.FencingToken)
		}
		for _, f := range []struct{ field, v string }{
			{"idempotency scope", opts.IdempotencyScope}, {"idempotency key", opts.IdempotencyKey},
		} {
			if f.v != "" {
				if err := core.CheckName(f.field, f.v); err != nil {
					return 0, err
				}
			}
		}
		p.GrantID = pgtype.Int8{Int64: opts.GrantID, Valid: opts.GrantID != 0}
		p.IdempotencyScope = pgtype.Text{String: opts.IdempotencyScope, Valid: opts.IdempotencyScope != ""}
		p.IdempotencyKey = pgtype.Text{String: opts.IdempotencyKey, Valid: opts.IdempotencyKey != ""}
		p.FencingToken = pgtype.Int8{Int64: opts.FencingToken, Valid: opts.FencingToken != 0}
	}
	row, err := c.queries.OutboxEnqueue(ctx, x, p)
	if err != nil {
		return 0, core.DBError("enqueue", err)
	}
	return row.ID, nil
}

// OutboxStatus is the state of the outbox.
type OutboxStatus struct {
	// Pending is the number of events waiting for delivery, Retrying of
	// them the ones that failed at least once.
	Pending  int64 `json:"pending"`
	Retrying int64 `json:"retrying"`
	// Delivered and Dead count finished events that ReapOutbox has not
	// removed yet. Dead events failed MaxAttempts times (the dead-letter
	// state) and are not delivered again.
	Delivered int64 `json:"delivered"`
	Dead      int64 `json:"dead"`
	// Lag is the age of the oldest pending event by the database clock, 0
	// when none is pending.
	Lag time.Duration `json:"lag_ns"`
	// At is the database clock's time of the reading.
	At time.Time `json:"at"`
}

// OutboxStatus counts the outbox's events by state and measures the lag.
// It reads the whole table: fine for monitoring every few seconds, not for
// a hot path.
//
// Errors: ErrSchemaMissing; database errors.
func (c *Client) OutboxStatus(ctx context.Context) (OutboxStatus, error) {
	row, err := c.queries.OutboxStatus(ctx, c.db.Reads())
	if err != nil {
		return OutboxStatus{}, core.DBError("outbox status", err)
	}
	return OutboxStatus{
		Pending:   row.Pending,
		Retrying:  row.Retrying,
		Delivered: row.Delivered,
		Dead:      row.Dead,
		Lag:       time.Duration(row.LagSeconds * float64(time.Second)),
		At:        core.TimeFromPG(row.Now),
	}, nil
}

// ReapOutbox deletes delivered and dead events that finished more than
// olderThan ago by the database clock, in batches, and returns how many it
// deleted. Pending events are never deleted.
//
// Errors: *InputError when olderThan is below one second; the context's
// error; ErrSchemaMissing; database errors.
//
// ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call.
func (c *Client) ReapOutbox(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < time.Second {
		return 0, core.Invalid("older than", "must be at least 1s, got %s", olderThan)
	}
	return core.Reap(ctx, func() (int64, error) {
		return c.queries.OutboxReap(ctx, c.db, db.OutboxReapParams{OlderThanUs: olderThan.Microseconds(), BatchSize: core.ReapBatch})
	}, "reap outbox")
}
