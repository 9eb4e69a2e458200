package quota_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// RelayConfig's BatchSize and MaxAttempts travel to the database as 32-bit
// integers. A larger value (valid for a Go int) must either be rejected by
// NewRelay, naming the field, or work as asked: it must not wrap around to
// a batch of 0 (a relay that never delivers anything) or a negative LIMIT,
// nor to a MaxAttempts of 0 (every failure dead at once).
func TestRelayConfigLargeValues(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)

	t.Run("BatchSize", func(t *testing.T) {
		id, err := b.client.Enqueue(b.ctx, "batch", []byte("x"), nil)
		require.NoError(t, err)
		for _, size := range []int{1 << 32, 1<<32 + 1<<31} {
			var got []int64
			r, err := b.client.NewRelay(func(_ context.Context, ev quota.Event) error {
				got = append(got, ev.ID)
				return nil
			}, quota.RelayConfig{Topics: []string{"batch"}, BatchSize: size})
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
		id, err := b.client.Enqueue(b.ctx, "attempts", []byte("x"), nil)
		require.NoError(t, err)
		r, err := b.client.NewRelay(func(context.Context, quota.Event) error {
			return errors.New("not now")
		}, quota.RelayConfig{Topics: []string{"attempts"}, MaxAttempts: 1 << 32})
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
	b.define(t, quota.Definition{Name: "points", Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)})
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
			_, err = client.EnqueueTx(ctx, tx, "points.granted", payload, &quota.EnqueueOpts{
				GrantID: g.GrantID, IdempotencyScope: g.IdempotencyScope, IdempotencyKey: g.IdempotencyKey,
			})
			return err
		})
	}
	require.NoError(t, example())
	require.NoError(t, example()) // the retry after a lost reply

	sum, _ := b.usageRows(t, "points", "alice")
	require.Equal(t, int64(50), sum, "granted once")
	var events int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.outbox WHERE idempotency_key = $1`, orderID).Scan(&events))
	require.Equal(t, int64(1), events, "one event for one grant")
}
