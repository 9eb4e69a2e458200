package quota_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

// A batch run by a role that may use schema pgquota but holds no privilege
// on its tables fails with ErrPermissionDenied, SQLSTATE 42501 and the
// privilege named, keyed or not: the keyed batch's transaction does not
// hide the refusal behind 25P02 ("current transaction is aborted").
func TestGrantBatchWithoutTablePrivilegesNamesThePrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	owner := pgtest.ConnectOwner(t, dbURL, 1)
	ownerClient, err := quota.New(owner, nil)
	require.NoError(t, err)
	_, err = ownerClient.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `REVOKE ALL ON ALL TABLES IN SCHEMA pgquota FROM `+migrations.AppRole)
	require.NoError(t, err)

	app := pgtest.Connect(t, pgtest.AppURL(t, dbURL), 2)
	client, err := quota.New(app, nil)
	require.NoError(t, err)
	for _, keyed := range []bool{false, true} {
		req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}
		if keyed {
			req.Idempotency = quota.IdempotencyKey{Key: "k1"}
		}
		_, err := client.GrantBatch(ctx, []quota.GrantRequest{req})
		require.ErrorIs(t, err, quota.ErrPermissionDenied, "keyed %v: %v", keyed, err)
		require.Equal(t, "42501", pgCode(err), "keyed %v: %v", keyed, err)
		require.Contains(t, err.Error(), "pgquota migrate grant-app --role", "keyed %v", keyed)
		t.Logf("keyed %v: %v", keyed, err)
	}
}
