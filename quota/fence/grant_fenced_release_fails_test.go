package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/fencedgrant"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// When GrantFenced's release fails after its grant committed (the backend
// was terminated), the call reports the committed grant as a success, so a
// caller who checks the error first does not grant again; the lease is left
// to expire on its own.
func TestGrantFencedReleaseFailsAfterCommit(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	admin := pgtest.Connect(t, dbURL, 1)
	pool := pgtest.Connect(t, dbURL, 1) // one connection: the release must use the terminated one
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	b := &testBundle{ctx: context.Background(), pool: admin, client: client, operator: operatorOf(t, client), owner: pgtest.ConnectOwner(t, dbURL, 1), leases: leaseOf(t, client), fences: fenceOf(t, client)}
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})

	var terminated []int32
	setFencedGrantRelease(client, func(ctx context.Context, l lease.Lease) {
		rows, err := admin.Query(ctx, `
			SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
			  AND usename = current_user`) // the client's role (admin's), not the operator's idle connection
		require.NoError(t, err)
		for rows.Next() {
			var ok bool
			var pid int32
			require.NoError(t, rows.Scan(&ok, &pid))
			terminated = append(terminated, pid)
		}
		require.NoError(t, rows.Err())
		require.Eventually(t, func() bool {
			var n int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, terminated).Scan(&n)
			return err == nil && n == 0
		}, 10*time.Second, 5*time.Millisecond, "the terminated backends exit")
	})

	const ttl = 2 * time.Second
	res, err := grantFenced(b.ctx, client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3}, ttl)
	require.NotEmpty(t, terminated, "the hook terminated the client's backend")
	require.NoError(t, err, "a committed grant is a success, whatever became of the release")
	require.True(t, res.Granted)
	require.Equal(t, int64(3), res.Used)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(3), sum)

	// The release failed: the lease is still held, and expires on its own.
	var held bool
	require.NoError(t, admin.QueryRow(b.ctx, `
		SELECT expires_at > clock_timestamp() FROM pgquota.lease WHERE name = $1`,
		fencedgrant.LeaseName("q", "m")).Scan(&held))
	require.True(t, held, "the release failed, so the lease runs until its TTL ends")

	// The next call waits for that expiry and grants.
	setFencedGrantRelease(client, nil)
	res, err = grantFenced(b.ctx, client, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, ttl)
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, int64(4), res.Used)
}
