package outbox

import (
	"context"
	"encoding/json"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/clientcore"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// Client writes, lists and reaps outbox events and makes relays. It is safe
// for concurrent use by many goroutines.
type Client struct {
	core *core.Core
}

// New returns an outbox client on c's pool, with c's settings (retries,
// metrics). It does not touch the database.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) when c is nil.
func New(c *quota.Client) (*Client, error) {
	k, err := clientcore.Of(c)
	if err != nil {
		return nil, err
	}
	return &Client{core: k}, nil
}

// EnqueueOpts stamps an outbox event with the operation it reports. Every
// field is optional; a nil *EnqueueOpts stamps nothing.
type EnqueueOpts struct {
	// GrantID is the ledger grant id of the operation (quota.Keyed.GrantID), so
	// the consumer can tell which grant the event belongs to, and
	// compensate it (quota.Client.CompensateGrant) when the side effect fails for good.
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
// typically the one that ran quota.Client.GrantTx: the event becomes visible to relays
// when tx commits, and vanishes if it rolls back, so it is sent if and only
// if the grant stands. topic names the kind of event (1 to quota.MaxNameBytes
// bytes, no control characters); payload is delivered as is (JSON,
// protobuf, ...). It returns the event's id.
//
// A grant and the event that reports it, committed together, retried as a
// whole on a serialization failure:
//
//	err := quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//		g, err := q.GrantTx(ctx, tx, quota.GrantRequest{
//			Quota: "points", Member: "alice", Amount: 50,
//			Idempotency: quota.IdempotencyKey{Key: orderID},
//		})
//		if err != nil || !g.Granted || g.Replayed {
//			return err
//		}
//		_, err = events.EnqueueTx(ctx, tx, "points.granted", payload, &outbox.EnqueueOpts{
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
// good, it compensates with the quota client's CompensateGrant(ctx, ev.GrantID).
//
// Errors: *quota.InputError for a bad topic or opts; quota.ErrSchemaMissing; database
// errors, returned unchanged (a serialization failure included, as for
// quota.Client.GrantTx).
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, topic string, payload []byte, opts *EnqueueOpts) (_ int64, err error) {
	defer c.core.M.Done(ctx, core.OpEnqueue, c.core.M.Now(), &err)
	return c.enqueue(ctx, tx, topic, payload, opts)
}

// Enqueue writes an event to the outbox in a transaction of its own. Use
// EnqueueTx to tie the event to other writes.
//
// Errors: as for EnqueueTx.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, read the outbox (Events); a blind
// repeat may enqueue the event twice (consumers dedupe by IdempotencyKey
// when set).
func (c *Client) Enqueue(ctx context.Context, topic string, payload []byte, opts *EnqueueOpts) (_ int64, err error) {
	defer c.core.M.Done(ctx, core.OpEnqueue, c.core.M.Now(), &err)
	return c.enqueue(ctx, c.core.DB, topic, payload, opts)
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
	row, err := c.core.Queries.OutboxEnqueue(ctx, x, p)
	if err != nil {
		return 0, core.DBError("enqueue", err)
	}
	return row.ID, nil
}

// Status is the state of the outbox.
type Status struct {
	// Pending is the number of events waiting for delivery, Retrying of
	// them the ones that failed at least once.
	Pending  int64 `json:"pending"`
	Retrying int64 `json:"retrying"`
	// Delivered and Dead count finished events that Reap has not
	// removed yet. Dead events failed MaxAttempts times (the dead-letter
	// state) and are not delivered again.
	Delivered int64 `json:"delivered"`
	Dead      int64 `json:"dead"`
	// Lag is the age of the oldest pending event by the database clock, 0
	// when none is pending.
	Lag time.Duration `json:"-"`
	// DBNow is the database clock's time of the reading.
	DBNow time.Time `json:"db_now"`
}

type statusJSON Status

type statusWire struct {
	statusJSON
	LagMS int64 `json:"lag_ms"`
}

// MarshalJSON encodes s with Lag in whole milliseconds (lag_ms), as the
// pgquota command prints it (docs/json-output.md).
func (s Status) MarshalJSON() ([]byte, error) {
	return json.Marshal(statusWire{statusJSON(s), s.Lag.Milliseconds()})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (s *Status) UnmarshalJSON(b []byte) error {
	var w statusWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = Status(w.statusJSON)
	s.Lag = min(time.Duration(w.LagMS), math.MaxInt64/time.Millisecond) * time.Millisecond
	return nil
}

// Status counts the outbox's events by state and measures the lag.
// It reads the whole table: fine for monitoring every few seconds, not for
// a hot path.
//
// Errors: quota.ErrSchemaMissing; database errors.
func (c *Client) Status(ctx context.Context) (Status, error) {
	row, err := c.core.Queries.OutboxStatus(ctx, c.core.DB.Reads())
	if err != nil {
		return Status{}, core.DBError("outbox status", err)
	}
	return Status{
		Pending:   row.Pending,
		Retrying:  row.Retrying,
		Delivered: row.Delivered,
		Dead:      row.Dead,
		Lag:       time.Duration(row.LagSeconds * float64(time.Second)),
		DBNow:     core.TimeFromPG(row.Now),
	}, nil
}

// Reap deletes delivered and dead events that finished more than
// olderThan ago by the database clock, in batches, and returns how many it
// deleted. Pending events are never deleted.
//
// Errors: *quota.InputError when olderThan is below one second; the context's
// error; quota.ErrSchemaMissing; database errors.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call.
func (c *Client) Reap(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < time.Second {
		return 0, core.Invalid("older than", "must be at least 1s, got %s", olderThan)
	}
	return core.Reap(ctx, func() (int64, error) {
		return c.core.Queries.OutboxReap(ctx, c.core.DB, db.OutboxReapParams{OlderThanUs: olderThan.Microseconds(), BatchSize: core.ReapBatch})
	}, "reap outbox")
}
