package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// GuardTable refuses a table that takes part in table inheritance (a
// statement on the parent changes the children's rows, a statement on a
// child bypasses the parent's triggers), naming the children, and attaches
// nothing.
func TestGuardRefusesTableWithInheritanceChildren(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.appDDL(t, `CREATE TABLE parent (id int PRIMARY KEY, val text, tok bigint);
		CREATE TABLE child (extra int) INHERITS (parent)`, nil, "parent", "child")
	for _, table := range []string{"parent", "child"} {
		_, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: table, Column: "tok"})
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie, table)
		require.Equal(t, "table", ie.Field)
		require.ErrorContains(t, err, "INHERITS: public.child", table)
	}
	gs, err := b.fences.GuardedTables(b.ctx)
	require.NoError(t, err)
	require.Empty(t, gs, "nothing attached")
}

// A guard whose trigger will not fire is reported as such by
// GuardedTables (pgquota.fence_guards()) and CheckGuards (/healthz):
// disabled, replica-only, dropped, or bypassed by a role set to
// session_replication_role = replica in this database; ENABLE ALWAYS
// TRIGGER fires for those sessions too.
func TestGuardNotFiringIsReported(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "reports", false)
	status := func() fence.GuardStatus {
		t.Helper()
		gs, err := b.fences.GuardedTables(b.ctx)
		require.NoError(t, err)
		require.Len(t, gs, 1)
		require.Equal(t, `public.reports`, gs[0].Table)
		require.Equal(t, g.Resource, gs[0].Resource)
		return gs[0]
	}
	require.Equal(t, fence.GuardStatus{Table: "public.reports", Resource: g.Resource, Fires: true}, status())
	require.NoError(t, b.fences.CheckGuards(b.ctx))

	for _, c := range []struct{ ddl, problem string }{
		{`ALTER TABLE reports DISABLE TRIGGER pgquota_fence_guard`, "trigger pgquota_fence_guard is disabled (DISABLE TRIGGER)"},
		{`ALTER TABLE reports ENABLE REPLICA TRIGGER pgquota_fence_guard`, "trigger pgquota_fence_guard fires only in replica sessions"},
		{`ALTER TABLE reports ENABLE TRIGGER pgquota_fence_guard; ALTER TABLE reports DISABLE TRIGGER pgquota_fence_guard_truncate`,
			"trigger pgquota_fence_guard_truncate is disabled"},
		{`ALTER TABLE reports ENABLE TRIGGER pgquota_fence_guard_truncate; ALTER TABLE reports DISABLE TRIGGER ALL`,
			"trigger pgquota_fence_guard is disabled (DISABLE TRIGGER): INSERT, UPDATE and DELETE are not guarded; trigger pgquota_fence_guard_truncate is disabled"},
		{`ALTER TABLE reports ENABLE TRIGGER ALL; DROP TRIGGER pgquota_fence_guard_truncate ON reports`, "trigger pgquota_fence_guard_truncate is missing"},
	} {
		_, err := b.owner.Exec(b.ctx, c.ddl)
		require.NoError(t, err, c.ddl)
		s := status()
		require.False(t, s.Fires, c.ddl)
		require.Contains(t, s.Problem, c.problem, c.ddl)
		err = b.fences.CheckGuards(b.ctx)
		require.ErrorIs(t, err, fence.ErrGuardNotFiring, c.ddl)
		require.ErrorContains(t, err, "public.reports: "+c.problem, c.ddl)
	}
	_, err := fenceOf(t, b.ownerClient(t)).GuardTable(b.ctx, fence.GuardTableRequest{Table: "reports", Column: "tok"})
	require.NoError(t, err, "attaching again restores the triggers")
	require.True(t, status().Fires)

	// A role whose sessions in this database run as replica.
	su, err := pgx.Connect(b.ctx, pgtest.BaseURL(t))
	require.NoError(t, err)
	defer func() { _ = su.Close(context.WithoutCancel(b.ctx)) }()
	role := fmt.Sprintf("pgquota_replica_%d", time.Now().UnixNano())
	var dbName string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT current_database()`).Scan(&dbName))
	_, err = su.Exec(b.ctx, fmt.Sprintf(`CREATE ROLE %s NOLOGIN; ALTER ROLE %[1]s IN DATABASE %s SET session_replication_role = replica`,
		role, pgx.Identifier{dbName}.Sanitize()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = su.Exec(context.Background(), fmt.Sprintf(`ALTER ROLE %s IN DATABASE %s RESET ALL; DROP ROLE %[1]s`, role, pgx.Identifier{dbName}.Sanitize()))
	})
	s := status()
	require.False(t, s.Fires)
	require.Contains(t, s.Problem, "session_replication_role = replica is set for role "+role+", whose sessions bypass the guard (ENABLE ALWAYS TRIGGER to guard them)")
	_, err = b.owner.Exec(b.ctx, `ALTER TABLE reports ENABLE ALWAYS TRIGGER pgquota_fence_guard; ALTER TABLE reports ENABLE ALWAYS TRIGGER pgquota_fence_guard_truncate`)
	require.NoError(t, err)
	require.True(t, status().Fires, "ALWAYS triggers fire in replica sessions too")
	require.NoError(t, b.fences.CheckGuards(b.ctx))

}
