package quota_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

// The suite's wiring: under PGQUOTA_TEST_APP_ROLE=1 a test's main client
// connects as the application's login, a member of pgquota_app alone (so
// it may not do operator work), its operator work goes through a client as
// the operator's login and its relay work through one as the relay's; in
// the normal pass the three are one client, as the database URL's role.
func TestAppRolePassConnectsEachWorkAsItsRole(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	relay := relayOf(t, b.client)
	user := func(c *quota.Client) string {
		t.Helper()
		var u string
		require.NoError(t, c.Pool().QueryRow(b.ctx, `SELECT current_user`).Scan(&u))
		return u
	}
	if !pgtest.AppRoleMode() {
		require.Same(t, b.client, b.operator)
		require.Same(t, b.client, relay)
		var owner string
		require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT current_user`).Scan(&owner))
		require.Equal(t, owner, user(b.client), "the URL's role")
		return
	}
	require.Equal(t, pgtest.AppLogin, user(b.client))
	require.Equal(t, pgtest.OperatorLogin, user(b.operator))
	require.Equal(t, pgtest.RelayLogin, user(relay))
	var memberOf []string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
		SELECT coalesce(array_agg(g.rolname::text ORDER BY g.rolname), '{}')
		FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles u ON u.oid = m.member
		WHERE u.rolname = current_user`).Scan(&memberOf))
	require.Equal(t, []string{migrations.AppRole}, memberOf, "the application's login is a member of %s alone", migrations.AppRole)
	_, err := b.client.DefineQuota(b.ctx, quota.Definition{Name: "q", Window: quota.WindowDay})
	require.ErrorIs(t, err, quota.ErrPermissionDenied, "the main client may not do operator work")
	_, err = b.operator.DefineQuota(b.ctx, quota.Definition{Name: "q", Window: quota.WindowDay})
	require.NoError(t, err)
}
