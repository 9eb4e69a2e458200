package quota_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/voucher"
)

// A voucher client and a lease client made on a quota.Client with a
// MeterProvider record into it: pgquota.voucher.claims by operation and
// outcome (claimed, repeat, sold_out, error; a replayed keyed claim counts
// as claimed again, as a replayed grant counts as granted), AcquireWait's lease
// requests, and their durations. Two capability clients of each kind on
// the one quota.Client (each creating the instruments again on the same
// provider) record into the same series, not into two.
func TestMetricsVoucherClaimsAndAcquireWaitRecordedThroughCapabilityClients(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "pool", 2)
	require.NoError(t, err)
	c, m := b.meteredClient(t, nil)
	v1, err := voucher.New(c, nil)
	require.NoError(t, err)
	v2, err := voucher.New(c, nil)
	require.NoError(t, err)

	key := quota.IdempotencyKey{Key: "order-1"}
	cl, err := v1.Claim(b.ctx, voucher.ClaimRequest{Campaign: "pool", Member: "a", Idempotency: key})
	require.NoError(t, err)
	require.True(t, cl.Claimed)
	cl, err = v2.Claim(b.ctx, voucher.ClaimRequest{Campaign: "pool", Member: "a", Idempotency: key})
	require.NoError(t, err)
	require.True(t, cl.Replayed)
	require.NoError(t, quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		_, err := v2.ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "pool", Member: "b"})
		return err
	}))
	cl, err = v1.Claim(b.ctx, voucher.ClaimRequest{Campaign: "pool", Member: "c"})
	require.NoError(t, err)
	require.False(t, cl.Claimed, "sold out")
	_, err = v1.Claim(b.ctx, voucher.ClaimRequest{Campaign: "nope", Member: "c"})
	require.ErrorIs(t, err, voucher.ErrCampaignNotFound)

	l1, err := lease.New(c)
	require.NoError(t, err)
	l2, err := lease.New(c)
	require.NoError(t, err)
	held, err := l1.Acquire(b.ctx, lease.AcquireRequest{Name: "w", Holder: "a", TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	_, err = l2.AcquireWait(b.ctx, lease.AcquireRequest{Name: "w", Holder: "b", TTL: time.Minute}, nil)
	require.NoError(t, err)
	_ = held

	rm := m.collect(t)
	for _, name := range []string{"pgquota.voucher.claims", "pgquota.lease.requests"} {
		md := find(rm, name)
		require.NotNil(t, md, name)
	}
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name == "pgquota.voucher.claims" {
				n++
			}
		}
	}
	require.Equal(t, 1, n, "one pgquota.voucher.claims instrument, however many voucher clients")
	for _, tc := range []struct {
		op, outcome string
		want        int64
	}{
		{"claim", "claimed", 2}, {"claim", "repeat", 0}, {"claim_tx", "claimed", 1}, {"claim", "sold_out", 1}, {"claim", "error", 1},
	} {
		require.Equal(t, tc.want, sumOf(t, "pgquota.voucher.claims", map[string]string{"pgquota.operation": tc.op, "pgquota.outcome": tc.outcome}, m), "%s %s", tc.op, tc.outcome)
	}
	require.Equal(t, int64(1), sumOf(t, "pgquota.lease.requests", map[string]string{"pgquota.operation": "acquire_wait", "pgquota.outcome": "acquired"}, m))
	require.Equal(t, int64(1), sumOf(t, "pgquota.lease.requests", map[string]string{"pgquota.operation": "acquire", "pgquota.outcome": "acquired"}, m))
	cnt, _ := histOf(t, "pgquota.operation.duration", map[string]string{"pgquota.operation": "acquire_wait"}, m)
	require.Equal(t, uint64(1), cnt)
}
