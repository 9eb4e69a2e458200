package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// appRoleBlock returns migration 00010's DO block that creates the app
// role and grants it, with role in place of pgquota_app throughout.
func appRoleBlock(t *testing.T, role string) string {
	t.Helper()
	b, err := migrations.FS.ReadFile("00010_app_role.sql")
	require.NoError(t, err)
	up, _, ok := strings.Cut(string(b), "-- +goose Down")
	require.True(t, ok)
	i := strings.Index(up, "DO $$")
	require.Positive(t, i)
	block, _, ok := strings.Cut(up[i:], "-- +goose StatementEnd")
	require.True(t, ok)
	return strings.ReplaceAll(block, migrations.AppRole, role)
}

// Migration 00010 run by a migrator that may not create roles (pgtestdb's
// owner has no CREATEROLE) and finds the app role missing succeeds with a
// WARNING that says who must create it and what to run then; it grants
// nothing and creates no role. (Roles are cluster-wide, so the test runs
// the migration's block with a role name of its own.)
func TestAppRoleMigrationWithoutCreateRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := fmt.Sprintf("pgquota_app_missing_%d", time.Now().UnixNano())
	cfg, err := pgx.ParseConfig(pgtest.NewURL(t))
	require.NoError(t, err)
	var mu sync.Mutex
	var notices []*pgconn.Notice
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var canCreate bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&canCreate))
	require.False(t, canCreate, "the test needs a migrator without CREATEROLE (pgtestdb's owner)")

	_, err = conn.Exec(ctx, appRoleBlock(t, role))
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, notices, 1)
	require.Equal(t, "WARNING", notices[0].Severity)
	require.Contains(t, notices[0].Message, "role "+role+" does not exist")
	require.Contains(t, notices[0].Message, "may not create it")
	require.Contains(t, notices[0].Hint, "CREATE ROLE "+role+" NOLOGIN")
	require.Contains(t, notices[0].Hint, "pgquota migrate grant-app")
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regrole($1) IS NOT NULL`, role).Scan(&exists))
	require.False(t, exists)
}
