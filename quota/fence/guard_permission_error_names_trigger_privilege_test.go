package fence_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// Attaching a guard runs CREATE TRIGGER on the user's table: a role that
// may run pgquota's operator functions but lacks the TRIGGER privilege on
// that table is told so (the table and the GRANT), not sent to
// grant-app for a privilege on pgquota's schema; the application role is
// told it needs the operator role; and nothing is attached either way.
func TestGuardPermissionErrorNamesTriggerPrivilege(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	_, err := b.owner.Exec(ctx, `CREATE TABLE public.orders (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	req := fence.GuardTableRequest{Table: "public.orders", Column: "tok"}

	_, err = fenceOf(t, b.opC).GuardTable(ctx, req)
	require.ErrorIs(t, err, quota.ErrPermissionDenied)
	require.Equal(t, "42501", pgCode(err))
	require.Contains(t, err.Error(), "creates triggers on public.orders, which needs the TRIGGER privilege")
	require.Contains(t, err.Error(), "GRANT TRIGGER ON public.orders TO ROLE")
	require.NotContains(t, err.Error(), "grant-app")

	_, err = fenceOf(t, b.appC).GuardTable(ctx, req)
	require.ErrorIs(t, err, quota.ErrPermissionDenied)
	require.Contains(t, err.Error(), "pgquota_operator")

	var triggers int
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.orders'::regclass`).Scan(&triggers))
	require.Zero(t, triggers, "a refused attach leaves no trigger")

	// With the privilege the operator attaches it.
	_, err = b.owner.Exec(ctx, `GRANT TRIGGER ON public.orders TO pgquota_operator`)
	require.NoError(t, err)
	g, err := fenceOf(t, b.opC).GuardTable(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "public.orders", g.Resource)
}
