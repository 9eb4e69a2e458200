package quota_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// The relay's deliveries by outcome match what it committed: 5 delivered,
// 2 failed once and then dead; every delivered event has one latency point;
// Enqueue counts the events written.
func TestMetricsOutboxDeliveriesByOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c, m := b.meteredClient(t, nil)
	for range 5 {
		_, err := outboxOf(t, c).Enqueue(b.ctx, "ok", []byte(`{}`), nil)
		require.NoError(t, err)
	}
	for range 2 {
		_, err := outboxOf(t, c).Enqueue(b.ctx, "bad", []byte(`{}`), nil)
		require.NoError(t, err)
	}
	// The relay's client reports to the same meter (c itself in the
	// normal pass).
	r, err := outboxOf(t, relayWith(t, c, &quota.Config{MeterProvider: m.provider}, roleConns)).NewRelay(func(_ context.Context, ev outbox.Event) error {
		if ev.Topic == "bad" {
			return errors.New("refused")
		}
		return nil
	}, outbox.RelayConfig{MaxAttempts: 2, RetryInitial: time.Millisecond, RetryMax: time.Millisecond})
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := r.RunOnce(b.ctx)
		require.NoError(t, err)
		st, err := outboxOf(t, c).Status(b.ctx)
		require.NoError(t, err)
		if st.Pending == 0 {
			require.Equal(t, int64(2), st.Dead)
			require.Equal(t, int64(5), st.Delivered)
			break
		}
		require.True(t, time.Now().Before(deadline), "events still pending: %+v", st)
	}
	for outcome, want := range map[string]int64{"delivered": 5, "failed": 2, "dead": 2} {
		require.Equal(t, want, sumOf(t, "pgquota.outbox.deliveries", map[string]string{"pgquota.outcome": outcome}, m), outcome)
	}
	require.Equal(t, int64(7), sumOf(t, "pgquota.outbox.enqueued", nil, m))
	n, sum := histOf(t, "pgquota.outbox.delivery.latency", nil, m)
	require.Equal(t, uint64(5), n)
	require.Greater(t, sum, 0.0)
}

// While a relay runs, the outbox gauges read the pending events and the
// oldest one's age by the database clock (exactly 90s with the clock set by
// hand); once it stops, they are gone.
func TestMetricsOutboxGaugesWhileRelayRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c, m := b.meteredClient(t, nil)
	b.setClock(t, "2030-01-01 00:00:00+00")
	for range 4 {
		_, err := outboxOf(t, c).Enqueue(b.ctx, "waiting", nil, nil)
		require.NoError(t, err)
	}
	b.setClock(t, "2030-01-01 00:01:30+00")
	// The relay delivers another topic only: the 4 stay pending.
	r, err := outboxOf(t, relayWith(t, c, &quota.Config{MeterProvider: m.provider}, roleConns)).NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.RelayConfig{Topics: []string{"other"}, PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	deadline := time.Now().Add(20 * time.Second)
	for find(m.collect(t), "pgquota.outbox.pending") == nil {
		require.True(t, time.Now().Before(deadline), "no outbox gauge while the relay runs")
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, int64(4), sumOf(t, "pgquota.outbox.pending", nil, m))
	require.InDelta(t, 90.0, gaugeFloat(t, m, "pgquota.outbox.oldest_pending.age"), 1e-6)

	cancel()
	require.NoError(t, <-done)
	require.Nil(t, find(m.collect(t), "pgquota.outbox.pending"), "gauges still reported after the relay stopped")
}
