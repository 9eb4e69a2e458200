package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// RelayConfig's BatchSize and MaxAttempts travel to the database as 32-bit
// integers. A larger value (valid for a Go int) must either be rejected by
// NewRelay, naming the field, or work as asked: it must not wrap around to
// a batch of 0 (a relay that never delivers anything) or a negative LIMIT,
// nor to a MaxAttempts of 0 (every failure dead at once).
func TestRelayConfigLargeValues(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rc := relayOf(t, b.client)

	t.Run("BatchSize", func(t *testing.T) {
		id, err := b.events.Enqueue(b.ctx, "batch", []byte("x"), nil)
		require.NoError(t, err)
		for _, size := range []int{1 << 32, 1<<32 + 1<<31} {
			var got []int64
			r, err := rc.NewRelay(func(_ context.Context, ev outbox.Event) error {
				got = append(got, ev.ID)
				return nil
			}, outbox.RelayConfig{Topics: []string{"batch"}, BatchSize: size})
			if err != nil {
				require.ErrorIs(t, err, quota.ErrInvalidInput)
				require.ErrorContains(t, err, "BatchSize")
				continue
			}
			res, err := r.RunOnce(b.ctx)
			require.NoError(t, err, "BatchSize %d", size)
			require.Equal(t, []int64{id}, got, "BatchSize %d: the due event is delivered", size)
			require.Equal(t, 1, res.Delivered)
			return
		}
	})

	t.Run("MaxAttempts", func(t *testing.T) {
		id, err := b.events.Enqueue(b.ctx, "attempts", []byte("x"), nil)
		require.NoError(t, err)
		r, err := rc.NewRelay(func(context.Context, outbox.Event) error {
			return errors.New("not now")
		}, outbox.RelayConfig{Topics: []string{"attempts"}, MaxAttempts: 1 << 32})
		if err != nil {
			require.ErrorIs(t, err, quota.ErrInvalidInput)
			require.ErrorContains(t, err, "MaxAttempts")
			return
		}
		res, err := r.RunOnce(b.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, res.Failed, "one failure of 2^32 allowed")
		var state string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT state FROM pgquota.outbox WHERE id = $1`, id).Scan(&state))
		require.Equal(t, "pending", state, "the event is retried, not dead after its first failure")
	})
}

// The transaction EnqueueTx's documentation shows (a keyed GrantTx and the
// event that reports it, committed together), run again with the same key
// as a client does when the first reply was lost after the commit: the
// repeat must change nothing more, so the outbox holds one event for the
// grant, not a second one with another event id that consumers cannot
// dedupe.
func TestEnqueueTxDocExampleRetriedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.Define(t, quota.Definition{Name: "points", Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)})
	client, pool, ctx := b.client, b.pool, b.ctx
	orderID, payload := "order-1234", []byte(`{"order":1234}`)

	// The example, as documented on EnqueueTx (which skips the event of a
	// replayed grant).
	example := func() error {
		return quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			g, err := client.GrantTx(ctx, tx, quota.GrantRequest{
				Quota: "points", Member: "alice", Amount: 50,
				Idempotency: quota.IdempotencyKey{Key: orderID},
			})
			if err != nil || !g.Granted || g.Replayed {
				return err
			}
			_, err = outboxOf(t, client).EnqueueTx(ctx, tx, "points.granted", payload, &outbox.EnqueueOpts{
				GrantID: g.GrantID, IdempotencyScope: g.IdempotencyScope, IdempotencyKey: g.IdempotencyKey,
			})
			return err
		})
	}
	require.NoError(t, example())
	require.NoError(t, example()) // the retry after a lost reply

	sum, _ := b.UsageRows(t, "points", "alice")
	require.Equal(t, int64(50), sum, "granted once")
	var events int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.outbox WHERE idempotency_key = $1`, orderID).Scan(&events))
	require.Equal(t, int64(1), events, "one event for one grant")
}

// A relay whose connection is lost mid-batch (killed by an operator, a
// network cut, idle_in_transaction_session_timeout) no longer holds its
// batch's row locks: another relay claims the same events at once. The
// first relay must then stop calling its handler for the rest of its
// batch, or two relays deliver one event at the same time, which the
// Relay documentation rules out ("no event is delivered by two relays at
// the same time"). The event in the handler when the connection died is
// beyond help; the ones after it are not.
func TestRelayLostConnectionStopsBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	// The relays' client, and the pool that finds and ends relay A's
	// backend: a role sees the state of its own sessions only, and may end
	// only those (b.client and b.pool in the normal pass). Relay A's
	// connection, that query's and relay B's are in use at once.
	rq := testbundle.RelayWith(t, b.client, nil, 4)
	rc := outboxOf(t, rq)
	rpool := rq.Pool()
	for range 3 {
		_, err := b.events.Enqueue(b.ctx, "t", []byte("x"), nil)
		require.NoError(t, err)
	}

	var (
		mu        sync.Mutex
		inFlight  = map[int64]string{}
		overlaps  []string
		bStarted  = make(chan struct{})
		aFinished = make(chan struct{})
	)
	enter := func(who string, id int64) {
		mu.Lock()
		defer mu.Unlock()
		// Event 1 was in relay A's handler when its connection died: that
		// overlap no relay can prevent.
		if other, ok := inFlight[id]; ok && id != 1 {
			overlaps = append(overlaps, fmt.Sprintf("event %d delivered by %s while %s delivers it", id, who, other))
		}
		inFlight[id] = who
	}
	leave := func(id int64) {
		mu.Lock()
		delete(inFlight, id)
		mu.Unlock()
	}

	relayB, err := rc.NewRelay(func(_ context.Context, ev outbox.Event) error {
		enter("relay B", ev.ID)
		defer leave(ev.ID)
		if ev.ID == 2 {
			close(bStarted)
			select { // B takes its time with event 2
			case <-aFinished:
			case <-time.After(2 * time.Second):
			}
		}
		return nil
	}, outbox.RelayConfig{})
	require.NoError(t, err)

	bDone := make(chan error, 1)
	relayA, err := rc.NewRelay(func(_ context.Context, ev outbox.Event) error {
		enter("relay A", ev.ID)
		defer leave(ev.ID)
		if ev.ID != 1 {
			return nil
		}
		// A's connection dies while it delivers event 1 ...
		var pid int32
		require.NoError(t, rpool.QueryRow(b.ctx, `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&pid))
		var killed bool
		require.NoError(t, rpool.QueryRow(b.ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
		require.True(t, killed)
		// pg_terminate_backend only signals: the batch's row locks are
		// gone once the backend has exited, and a relay that claimed
		// before that would skip the still-locked events.
		testbundle.WaitFor(t, "relay A's backend to exit", func() bool {
			var alive bool
			require.NoError(t, rpool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive))
			return !alive
		})
		// ... and relay B claims the batch A held.
		go func() {
			_, err := relayB.RunOnce(b.ctx)
			bDone <- err
		}()
		select {
		case <-bStarted:
		case <-time.After(5 * time.Second):
			t.Error("relay B did not claim the events relay A lost")
		}
		return nil
	}, outbox.RelayConfig{})
	require.NoError(t, err)

	_, errA := relayA.RunOnce(b.ctx)
	close(aFinished)
	require.Error(t, errA, "relay A cannot record its batch")
	require.NoError(t, <-bDone)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, overlaps)
}
