package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// OutboxEvents selects by state (retrying, dead and failed by the last
// error), topic and id, and carries each event's last error.
func TestOutboxEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	rc := relayOf(t, b.client)
	var ids []int64
	for _, topic := range []string{"ok", "flaky", "doomed", "ok"} {
		id, err := b.events.Enqueue(b.ctx, topic, []byte(topic), &outbox.EnqueueOpts{GrantID: 3})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	r, err := rc.NewRelay(func(_ context.Context, ev outbox.Event) error {
		switch ev.Topic {
		case "flaky":
			return errors.New("broker unavailable")
		case "doomed":
			return errors.New("rejected for good")
		}
		return nil
	}, outbox.RelayConfig{MaxAttempts: 2, RetryInitial: time.Millisecond, RetryMax: time.Millisecond})
	require.NoError(t, err)
	_, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	_, err = r.RunOnce(b.ctx) // doomed (and flaky) fail a second time: dead
	require.NoError(t, err)

	list := func(f outbox.Filter) []int64 {
		t.Helper()
		evs, err := b.events.Events(b.ctx, f)
		require.NoError(t, err)
		got := []int64{}
		for _, ev := range evs {
			got = append(got, ev.ID)
		}
		return got
	}
	require.Equal(t, ids, list(outbox.Filter{}))
	require.Equal(t, []int64{ids[0], ids[3]}, list(outbox.Filter{State: outbox.StateDelivered}))
	require.Equal(t, []int64{ids[1], ids[2]}, list(outbox.Filter{State: outbox.StateDead}))
	require.Equal(t, []int64{ids[1], ids[2]}, list(outbox.Filter{State: outbox.StateFailed}))
	require.Equal(t, []int64{}, list(outbox.Filter{State: outbox.StateRetrying}))
	require.Equal(t, []int64{ids[2]}, list(outbox.Filter{State: outbox.StateFailed, Topics: []string{"doomed"}}))
	require.Equal(t, []int64{ids[2], ids[3]}, list(outbox.Filter{AfterID: ids[1]}))
	require.Equal(t, []int64{ids[0]}, list(outbox.Filter{Limit: 1}))

	evs, err := b.events.Events(b.ctx, outbox.Filter{Topics: []string{"doomed"}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	ev := evs[0]
	require.Equal(t, outbox.StateDead, ev.State)
	require.Equal(t, 2, ev.Attempts)
	require.Equal(t, "rejected for good", ev.LastError)
	require.Equal(t, int64(3), ev.GrantID)
	require.Equal(t, []byte("doomed"), ev.Payload)
	require.False(t, ev.FinishedAt.IsZero())
	require.True(t, ev.NextAttemptAt.IsZero(), "finished events are not due")

	// A retrying event: pending after a failure.
	id, err := b.events.Enqueue(b.ctx, "later", nil, nil)
	require.NoError(t, err)
	r, err = rc.NewRelay(func(context.Context, outbox.Event) error { return errors.New("not yet") },
		outbox.RelayConfig{Topics: []string{"later"}, RetryInitial: time.Hour, RetryMax: time.Hour})
	require.NoError(t, err)
	_, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	evs, err = b.events.Events(b.ctx, outbox.Filter{State: outbox.StateRetrying})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, id, evs[0].ID)
	require.Equal(t, outbox.StatePending, evs[0].State)
	require.Equal(t, "not yet", evs[0].LastError)
	require.True(t, evs[0].NextAttemptAt.After(evs[0].CreatedAt.Add(10*time.Minute)))

	for _, f := range []outbox.Filter{{State: "lost"}, {Limit: -1}, {Limit: 10001}, {Topics: []string{""}}} {
		_, err := b.events.Events(b.ctx, f)
		require.ErrorIs(t, err, quota.ErrInvalidInput, "%+v", f)
	}
}
