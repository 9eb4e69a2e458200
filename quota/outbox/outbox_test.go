package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// 10,000 events enqueued by concurrent transactions, some of which commit
// late (their events have low ids, and commit after higher ids were
// delivered), relayed by 3 relays at once with injected handler failures:
// every committed event is delivered, none of a rolled-back transaction is,
// no event is delivered by two relays at the same time, and an event is
// delivered more than once only when a handler failure forced a retry.
func TestRelayDeliversEveryEventOnce(t *testing.T) {
	t.Parallel()
	const (
		want      = 10_000
		lateTxs   = 5
		latePerTx = 20
		producers = 12
		perTx     = 10
		relays    = 3
	)
	b := setup(t, 32)
	rc := relayWith(t, b.client, nil, relays) // one connection per relay
	b.Define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](1 << 40)})

	// failures(id) is the number of times the handler fails an event before
	// accepting it.
	failures := func(id int64) int {
		switch {
		case id%97 == 0:
			return 2
		case id%13 == 0:
			return 1
		}
		return 0
	}

	var (
		mu         sync.Mutex
		deliveries = map[int64]int{}
		inFlight   = map[int64]bool{}
		injected   int
		maxSeen    int64
		violation  error
	)
	var delivered atomic.Int64 // distinct events accepted
	handler := func(ctx context.Context, ev outbox.Event) error {
		mu.Lock()
		if inFlight[ev.ID] && violation == nil {
			violation = fmt.Errorf("event %d delivered by two relays at once", ev.ID)
		}
		inFlight[ev.ID] = true
		deliveries[ev.ID]++
		fail := ev.Attempt <= failures(ev.ID)
		if ev.Attempt != deliveries[ev.ID] && violation == nil {
			violation = fmt.Errorf("event %d: attempt %d on delivery %d", ev.ID, ev.Attempt, deliveries[ev.ID])
		}
		if fail {
			injected++
		}
		mu.Unlock()
		if ev.ID%500 == 0 {
			time.Sleep(time.Millisecond) // widen the window for overlapping claims
		}
		mu.Lock()
		delete(inFlight, ev.ID)
		if !fail {
			maxSeen = max(maxSeen, ev.ID)
		}
		mu.Unlock()
		if fail {
			return errors.New("injected failure")
		}
		delivered.Add(1)
		return nil
	}

	var (
		committedMu sync.Mutex
		committed   = map[int64]bool{} // events of committed transactions
		rolledBack  = map[int64]bool{}
	)
	record := func(ids []int64, ok bool) {
		committedMu.Lock()
		defer committedMu.Unlock()
		for _, id := range ids {
			if ok {
				committed[id] = true
			} else {
				rolledBack[id] = true
			}
		}
	}
	enqueue := func(tx pgx.Tx, n int, opts *outbox.EnqueueOpts) ([]int64, error) {
		ids := make([]int64, 0, n)
		for j := range n {
			id, err := b.events.EnqueueTx(b.ctx, tx, "grant.made", []byte(fmt.Sprintf(`{"n":%d}`, j)), opts)
			if err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
		return ids, nil
	}

	// The late transactions enqueue first, so their events have the lowest
	// ids, and stay open until the relays have delivered a good part of the
	// rest.
	type late struct {
		tx  pgx.Tx
		ids []int64
	}
	lates := make([]late, lateTxs)
	for i := range lates {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		ids, err := enqueue(tx, latePerTx, nil)
		require.NoError(t, err)
		lates[i] = late{tx, ids}
	}

	ctx, stop := context.WithCancel(b.ctx)
	defer stop()
	var relaysDone sync.WaitGroup
	for range relays {
		r, err := rc.NewRelay(handler, outbox.RelayConfig{
			BatchSize:    50,
			PollInterval: 5 * time.Millisecond,
			MaxAttempts:  5,
			RetryInitial: 2 * time.Millisecond,
			RetryMax:     10 * time.Millisecond,
			OnError:      func(err error) { t.Errorf("relay: %v", err) },
		})
		require.NoError(t, err)
		relaysDone.Add(1)
		go func() {
			defer relaysDone.Done()
			_ = r.Run(ctx)
		}()
	}

	// Producers: transactions of perTx events, every 7th also making a
	// keyed grant that stamps its events, every 25th rolled back.
	// Transactions are numbered 1..txs; every 25th rolls back, and txs is
	// the smallest count whose committed transactions make exactly want
	// events together with the late ones.
	const committedTxs = (want - lateTxs*latePerTx) / perTx
	txs := int64(0)
	for c := 0; c < committedTxs; {
		txs++
		if txs%25 != 0 {
			c++
		}
	}
	var txSeq atomic.Int64
	var producerErr error
	var perrMu sync.Mutex
	testbundle.Concurrently(producers, func(int) {
		for n := txSeq.Add(1); n <= txs; n = txSeq.Add(1) {
			rollback := n%25 == 0
			var ids []int64
			err := quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
				var opts *outbox.EnqueueOpts
				if n%7 == 0 {
					g, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key(fmt.Sprint("tx", n))})
					if err != nil {
						return err
					}
					opts = &outbox.EnqueueOpts{GrantID: g.GrantID, IdempotencyScope: g.IdempotencyScope, IdempotencyKey: g.IdempotencyKey, FencingToken: n}
				}
				var err error
				ids, err = enqueue(tx, perTx, opts)
				if err != nil {
					return err
				}
				if rollback {
					return errRollback
				}
				return nil
			})
			if rollback && errors.Is(err, errRollback) {
				record(ids, false)
				continue
			}
			if err != nil {
				perrMu.Lock()
				producerErr = err
				perrMu.Unlock()
				return
			}
			record(ids, true)
		}
	})
	require.NoError(t, producerErr)

	// Commit the late transactions once higher ids have been delivered.
	require.Eventually(t, func() bool { return delivered.Load() >= 2000 }, time.Minute, 5*time.Millisecond)
	for _, l := range lates {
		mu.Lock()
		seen := maxSeen
		mu.Unlock()
		require.Greater(t, seen, l.ids[len(l.ids)-1], "higher ids were delivered before the late transaction committed")
		require.NoError(t, l.tx.Commit(b.ctx))
		record(l.ids, true)
	}

	committedMu.Lock()
	total := len(committed)
	committedMu.Unlock()
	require.Eventually(t, func() bool { return delivered.Load() >= int64(total) }, 2*time.Minute, 10*time.Millisecond)
	stop()
	relaysDone.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.NoError(t, violation)
	require.Equal(t, want, total)
	var extra int
	for id := range committed {
		n := deliveries[id]
		require.Equal(t, failures(id)+1, n, "event %d", id)
		extra += n - 1
	}
	for id := range rolledBack {
		require.Zero(t, deliveries[id], "event %d of a rolled-back transaction", id)
	}
	require.Len(t, deliveries, total, "no event outside the committed ones")
	require.Equal(t, injected, extra, "every redelivery was forced by an injected failure")
	require.Positive(t, injected)
	t.Logf("%d events delivered by %d relays, %d redeliveries after %d injected failures, %d rolled back",
		total, relays, extra, injected, len(rolledBack))

	st, err := b.events.Status(b.ctx)
	require.NoError(t, err)
	require.Zero(t, st.Pending)
	require.Zero(t, st.Dead)
	require.Equal(t, int64(total), st.Delivered)
	require.Zero(t, st.Lag)
}

var errRollback = errors.New("roll back on purpose")

// A failed event waits for next_attempt_at, computed from the database
// clock, and becomes dead after MaxAttempts failures.
func TestRelayRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	rc := relayOf(t, b.client)
	b.SetClock(t, "2030-01-01 00:00:00+00")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	id, err := b.events.Enqueue(b.ctx, "mail", []byte("hello"), &outbox.EnqueueOpts{GrantID: 7, FencingToken: 3})
	require.NoError(t, err)
	var attempts []outbox.Event
	r, err := rc.NewRelay(func(_ context.Context, ev outbox.Event) error {
		attempts = append(attempts, ev)
		return fmt.Errorf("smtp: 451 try again \x00 later \xff")
	}, outbox.RelayConfig{MaxAttempts: 3, RetryInitial: time.Minute, RetryMax: time.Hour})
	require.NoError(t, err)

	res, err := r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 1, Failed: 1}, res)
	require.Len(t, attempts, 1)
	require.Equal(t, id, attempts[0].ID)
	require.Equal(t, 1, attempts[0].Attempt)
	require.Equal(t, int64(7), attempts[0].GrantID)
	require.Equal(t, int64(3), attempts[0].FencingToken)
	require.Equal(t, []byte("hello"), attempts[0].Payload)

	var next time.Time
	var lastErr string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT next_attempt_at, last_error FROM pgquota.outbox WHERE id = $1`, id).Scan(&next, &lastErr))
	require.WithinRange(t, next, t0.Add(30*time.Second), t0.Add(90*time.Second), "RetryInitial ±50%% from the database clock")
	require.Contains(t, lastErr, "smtp: 451")

	// Not due yet by the database clock.
	res, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.Claimed)

	st, err := b.events.Status(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Pending)
	require.Equal(t, int64(1), st.Retrying)
	require.Equal(t, time.Duration(0), st.Lag) // the clock is pinned at created_at

	b.SetClock(t, "2030-01-01 01:00:00+00")
	res, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Failed)
	b.SetClock(t, "2030-01-01 05:00:00+00")
	res, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Dead)
	require.Len(t, attempts, 3)
	require.Equal(t, 3, attempts[2].Attempt)

	b.SetClock(t, "2030-02-01 00:00:00+00")
	res, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "a dead event is not delivered again")
	st, err = b.events.Status(b.ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Status{Dead: 1, DBNow: st.DBNow}, st)

	// Reaping removes finished events older than the period.
	n, err := rc.Reap(b.ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, b.CountRows(t, "outbox"))
}

func TestRelayTopicsAndPanics(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	rc := relayOf(t, b.client)
	_, err := b.events.Enqueue(b.ctx, "a", []byte("1"), nil)
	require.NoError(t, err)
	_, err = b.events.Enqueue(b.ctx, "b", nil, nil)
	require.NoError(t, err)

	var got []string
	r, err := rc.NewRelay(func(_ context.Context, ev outbox.Event) error {
		got = append(got, ev.Topic)
		if ev.Topic == "b" {
			panic("boom")
		}
		return nil
	}, outbox.RelayConfig{Topics: []string{"a"}})
	require.NoError(t, err)
	res, err := r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 1, Delivered: 1}, res)
	require.Equal(t, []string{"a"}, got)

	r, err = rc.NewRelay(r2handler(&got), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err = r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 1, Failed: 1}, res, "a panic is a failed delivery")

	_, err = rc.NewRelay(nil, outbox.RelayConfig{})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	_, err = b.events.EnqueueTx(b.ctx, nil, "", nil, nil)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
}

func r2handler(got *[]string) outbox.Handler {
	return func(_ context.Context, ev outbox.Event) error {
		*got = append(*got, ev.Topic)
		panic("boom")
	}
}

// A relay whose context ends mid-batch records what its handler accepted
// and leaves the rest pending, without counting an attempt.
func TestRelayStopsMidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	rq := testbundle.RelayOf(t, b.client)
	rc := outboxOf(t, rq)
	for range 5 {
		_, err := b.events.Enqueue(b.ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	calls := 0
	r, err := rc.NewRelay(func(ctx context.Context, _ outbox.Event) error {
		calls++
		if calls == 2 {
			cancel()
			return ctx.Err()
		}
		return nil
	}, outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 5, Delivered: 1}, res)
	st, err := b.events.Status(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), st.Pending)
	require.Zero(t, st.Retrying)
	require.Equal(t, int64(1), st.Delivered)
	require.Zero(t, rq.Pool().Stat().AcquiredConns(), "the relay gave its connection back")
}
