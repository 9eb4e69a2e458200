package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Outbox event states, as EventRow.State holds them and Filter
// selects them.
const (
	// StatePending: waiting for its first delivery or for a retry.
	StatePending = "pending"
	// StateDelivered: a relay's handler accepted it.
	StateDelivered = "delivered"
	// StateDead: it failed RelayConfig.MaxAttempts times and is not
	// delivered again (the dead-letter state).
	StateDead = "dead"
	// StateRetrying selects pending events whose last attempt failed.
	StateRetrying = "retrying"
	// StateFailed selects the events whose last attempt failed: retrying
	// and dead ones.
	StateFailed = "failed"
)

// EventRow is an outbox event with its delivery state, as Events
// lists it.
type EventRow struct {
	ID      int64  `json:"id"`
	Topic   string `json:"topic"`
	Payload []byte `json:"payload"`
	// GrantID, IdempotencyScope, IdempotencyKey and FencingToken are the
	// EnqueueOpts the event was written with (zero when not set).
	GrantID          int64  `json:"grant_id"`
	IdempotencyScope string `json:"idempotency_scope"`
	IdempotencyKey   string `json:"idempotency_key"`
	FencingToken     int64  `json:"fencing_token"`
	// State is StatePending, StateDelivered or StateDead.
	State string `json:"state"`
	// Attempts counts the recorded deliveries, failed or not.
	Attempts int `json:"attempts"`
	// LastError is the handler's error of the last failed attempt; empty
	// once the event is delivered, or before it failed.
	LastError string `json:"last_error"`
	// NextAttemptAt is when a pending event is due; zero for finished ones.
	NextAttemptAt time.Time `json:"next_attempt_at"`
	CreatedAt     time.Time `json:"created_at"`
	// FinishedAt is when the event was delivered or died; zero while
	// pending.
	FinishedAt time.Time `json:"finished_at"`
}

// Filter selects the events Events lists.
type Filter struct {
	// State is StatePending, StateRetrying, StateDead, StateDelivered
	// or StateFailed. Defaults to every event.
	State string
	// Topics limits the list to events of these topics. Defaults to every
	// topic.
	Topics []string
	// AfterID lists only events with a higher id, to page through a long
	// list. Defaults to 0: from the first.
	AfterID int64
	// Limit is the most events returned, at most 10,000. Defaults to 100.
	Limit int
}

// Events lists outbox events in id order, with their state, attempts
// and last error, for operators: which events are dead, and why. It takes
// no lock, so a relay may change what it lists meanwhile.
//
// Errors: *quota.InputError for an unknown state, a bad topic or a limit out of
// range; quota.ErrSchemaMissing; database errors.
func (c *Client) Events(ctx context.Context, f Filter) ([]EventRow, error) {
	p := db.OutboxListParams{AfterID: f.AfterID, Topics: f.Topics, MaxEvents: 100}
	switch f.State {
	case "":
		p.States = []string{StatePending, StateDelivered, StateDead}
	case StatePending, StateDelivered, StateDead:
		p.States = []string{f.State}
	case StateRetrying:
		p.States, p.FailedOnly = []string{StatePending}, true
	case StateFailed:
		p.States, p.FailedOnly = []string{StatePending, StateDead}, true
	default:
		return nil, core.Invalid("state", "must be pending, retrying, dead, delivered or failed, got %q", f.State)
	}
	for i, t := range f.Topics {
		if err := core.CheckName(fmt.Sprintf("topic %d", i+1), t); err != nil {
			return nil, err
		}
	}
	if p.Topics == nil {
		p.Topics = []string{}
	}
	switch {
	case f.Limit < 0 || f.Limit > 10000:
		return nil, core.Invalid("limit", "must be between 1 and 10000, got %d", f.Limit)
	case f.Limit > 0:
		p.MaxEvents = int32(f.Limit)
	}
	rows, err := core.Retry(ctx, c.core.Policy, func() ([]db.PgquotaOutbox, error) { return c.core.Queries.OutboxList(ctx, c.core.DB.Reads(), p) })
	if err != nil {
		return nil, core.DBError("list outbox", err)
	}
	events := make([]EventRow, len(rows))
	for i, r := range rows {
		events[i] = EventRow{
			ID:               r.ID,
			Topic:            r.Topic,
			Payload:          r.Payload,
			GrantID:          r.GrantID.Int64,
			IdempotencyScope: r.IdempotencyScope.String,
			IdempotencyKey:   r.IdempotencyKey.String,
			FencingToken:     r.FencingToken.Int64,
			State:            r.State,
			Attempts:         int(r.Attempts),
			LastError:        r.LastError.String,
			CreatedAt:        core.TimeFromPG(r.CreatedAt),
			FinishedAt:       core.TimeFromPG(r.FinishedAt),
		}
		if r.State == StatePending {
			events[i].NextAttemptAt = core.TimeFromPG(r.NextAttemptAt)
		}
	}
	return events, nil
}
