package fence_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// On a resource no guard binds, RunTx checks the lease when TxRequest.Lease
// names it: a released lease's token and a token the lease never issued
// are refused with lease.ErrLost before fn runs, and the real holder still
// writes. With Lease empty, the resource is a plain fencing-token store
// (checked against its highest token seen only), as PresentTokenTx
// documents: the released holder's token, still the highest, is admitted.
func TestRunTxOnUnguardedResourceChecksTheLeaseWhenNamed(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const res = "jobs"
	ran := 0
	fn := func(pgx.Tx) error { ran++; return nil }
	named := func(token int64) fence.TxRequest { return fence.TxRequest{Resource: res, Token: token, Lease: res} }

	a := b.acquire(t, res, "A", time.Minute)
	require.NoError(t, b.fences.RunTx(b.ctx, named(a.Token), fn))
	require.Equal(t, 1, ran)

	_, err := b.leases.Release(b.ctx, lease.Lease{Name: res, Token: a.Token})
	require.NoError(t, err)
	err = b.fences.RunTx(b.ctx, named(a.Token), fn)
	require.ErrorIs(t, err, lease.ErrLost, "a released lease's token, the lease named")
	require.Equal(t, 1, ran, "fn did not run")

	require.NoError(t, b.fences.RunTx(b.ctx, fence.TxRequest{Resource: res, Token: a.Token}, fn),
		"no lease named, no guard: the highest token seen alone is checked")
	require.Equal(t, 2, ran)

	bl := b.acquire(t, res, "B", time.Minute)
	err = b.fences.RunTx(b.ctx, named(bl.Token+1_000_000), fn)
	require.ErrorIs(t, err, lease.ErrLost, "a token the lease never issued, the lease named")
	require.Equal(t, 2, ran, "fn did not run")
	require.NoError(t, b.fences.RunTx(b.ctx, named(bl.Token), fn), "the real holder B still writes")
	require.Equal(t, 3, ran)

	st, err := b.fences.State(b.ctx, res)
	require.NoError(t, err)
	require.Equal(t, bl.Token, st.Highest, "no refused token raised the mark")
}
