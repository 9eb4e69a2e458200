package fence_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// The fence's guarantee: "Once a lease on a resource has been acquired with token T,
// no write carrying a token below T lands on any fenced row of that
// resource, whichever row it touches, however long the old holder was
// paused." On a table guarded by GuardTable the old holder's write
// lands as long as the new holder has not written yet: the guard compares
// with the highest token written, and an acquisition does not raise it,
// even when the lease is named after the guard's resource.
func TestBreakFenceGuardAdmitsStaleHolderAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	// DDL on purpose, as the owner: the application's table and its guard.
	b.appDDL(t, `CREATE TABLE public.orders (id int PRIMARY KEY, status text, fence_token bigint)`, nil, "public.orders")
	g, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "orders", Column: "fence_token"})
	require.NoError(t, err)

	// The lease is named after the guard's resource.
	h1 := b.acquire(t, g.Resource, "one", 200*time.Millisecond)
	require.NoError(t, b.txWith(t, g.Resource, h1.Token, `INSERT INTO orders VALUES (1, 'new', NULL)`))

	time.Sleep(400 * time.Millisecond) // holder one pauses past its TTL
	h2 := b.acquire(t, g.Resource, "two", time.Minute)
	require.Greater(t, h2.Token, h1.Token)

	// Holder one wakes up and writes with its token, below h2's.
	err = b.txWith(t, g.Resource, h1.Token, `UPDATE orders SET status = 'cancelled' WHERE id = 1`)
	require.ErrorIs(t, err, fence.ErrStaleToken,
		"a write with token %d after the lease was acquired with token %d", h1.Token, h2.Token)
}

// Bad table names must be rejected as input naming the field ("table"),
// like a table that does not exist, not as a raw database error.
func TestBreakAttachFenceGuardBadTableName(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	for _, table := range []string{
		`x; DROP TABLE y`,
		`"unterminated`,
		`a.b.c.d`,
		`otherdb.public.t`,
	} {
		_, err := fenceOf(t, b.operator).GuardTable(b.ctx, fence.GuardTableRequest{Table: table, Column: "fence_token"})
		require.ErrorIs(t, err, quota.ErrInvalidInput, table)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie, table)
		require.Equal(t, "table", ie.Field, table)
	}
}

// Attaching the guard to one of pgquota's own tables is accepted, and then
// every fenced write fails: pgquota.fence_admit writes pgquota.fence, whose
// guard calls pgquota.fence_admit again, without end.
func TestBreakAttachFenceGuardOnPgquotaTable(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	_, err := fenceOf(t, b.operator).GuardTable(b.ctx, fence.GuardTableRequest{Table: "pgquota.fence", Column: "max_token"})
	if err == nil {
		_, werr := b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "r", Key: "k", Value: "v", Token: 1})
		require.NoError(t, werr, "fenced writes still work after the guard was accepted")
	}
	require.ErrorIs(t, err, quota.ErrInvalidInput)
}
