package quota_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/calltest"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

// A login role whose only privileges come from membership in pgquota_app
// (migrations.AppRole) makes every API call, with the relay's calls made
// by a member of pgquota_relay and the definitions by a member of
// pgquota_operator; a table that a later migration adds to schema pgquota
// is readable by it as it is created (default privileges), never
// writable.
func TestAppRoleMakesEveryCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	app := pgtest.Connect(t, pgtest.AppURL(t, dbURL), 4)
	var user string
	var super bool
	require.NoError(t, app.QueryRow(ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &super))
	require.Equal(t, pgtest.AppLogin, user)
	require.False(t, super)

	client, err := quota.New(app, nil)
	require.NoError(t, err)
	relay, err := quota.New(pgtest.Connect(t, pgtest.RelayURL(t, dbURL), 2), nil)
	require.NoError(t, err)
	operator, err := quota.New(pgtest.Connect(t, pgtest.OperatorURL(t, dbURL), 2), nil)
	require.NoError(t, err)
	calltest.ExerciseRoles(t, calltest.Clients{App: client, Relay: relay, Operator: operator}, "app_")

	// The app role may not migrate or change the schema.
	_, err = app.Exec(ctx, `CREATE TABLE pgquota.app_made (id int)`)
	require.Error(t, err)
	require.Equal(t, "42501", pgCode(err))

	// A table a later migration (run by the owner) creates is the role's
	// to read at once (default privileges), never to write.
	owner := pgtest.ConnectOwner(t, dbURL, 1)
	_, err = owner.Exec(ctx, `CREATE TABLE pgquota.later_table (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)`)
	require.NoError(t, err)
	_, err = app.Exec(ctx, `SELECT * FROM pgquota.later_table`)
	require.NoError(t, err)
	_, err = app.Exec(ctx, `INSERT INTO pgquota.later_table (v) VALUES ('x')`)
	require.Equal(t, "42501", pgCode(err))
	// The version table is read, never written.
	_, err = app.Exec(ctx, `DELETE FROM `+migrations.VersionTable)
	require.Equal(t, "42501", pgCode(err))
}

// A privilege the role lacks fails the call at once, with ErrPermissionDenied,
// the SQLSTATE kept, and a message naming the object, the privilege and
// the fix (where `migrate status` as such a role retried a lock write for
// about 5 minutes).
func TestPermissionErrorFailsAtOnceNamingPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	owner := pgtest.ConnectOwner(t, dbURL, 1)
	_, err := owner.Exec(ctx, `REVOKE EXECUTE ON FUNCTION pgquota.grant(text, text, bigint, bigint), pgquota.grant_row(text, text, bigint, bigint) FROM `+migrations.AppRole)
	require.NoError(t, err)
	app := pgtest.Connect(t, pgtest.AppURL(t, dbURL), 2)
	client, err := quota.New(app, nil)
	require.NoError(t, err)
	operator, err := quota.New(pgtest.Connect(t, pgtest.OperatorURL(t, dbURL), 1), nil)
	require.NoError(t, err)
	_, err = operator.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	require.NoError(t, err)

	start := time.Now()
	_, err = client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	took := time.Since(start)
	require.ErrorIs(t, err, quota.ErrPermissionDenied)
	require.Equal(t, "42501", pgCode(err))
	require.Contains(t, err.Error(), "EXECUTE")
	require.Contains(t, err.Error(), "pgquota.grant")
	require.Contains(t, err.Error(), "pgquota migrate grant-app --role")
	require.Less(t, took, 5*time.Second, "not retried")
	t.Logf("permission error after %s: %v", took.Round(time.Millisecond), err)

	// The schema check needs SELECT on the version table, which the role has.
	require.NoError(t, client.CheckSchema(ctx))
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
