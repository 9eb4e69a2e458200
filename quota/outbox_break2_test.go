package quota_test

import (
	"context"
	"errors"
	"testing"

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
