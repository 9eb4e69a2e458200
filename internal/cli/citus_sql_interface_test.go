//go:build citus

package cli_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/pgcluster"
)

// The SQL interface (docs/sql.md) on a Citus coordinator, called with
// plain SQL as an application role: 20 concurrent pgquota.grant at a limit
// of 5 give 5; a keyed grant and a keyed claim happen once; revokes give
// units back, once with a key; 20 concurrent pgquota.claim of 5 vouchers
// give 5; compensate_grant gives a keyed grant's units back once;
// limit_usage reads every counter as written.
func TestCitusSQLInterfaceIsExact(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	c.Exec(`CREATE ROLE app LOGIN`)
	ok(t, c.URL(), "migrate", "grant-app", "--role", "app")
	ok(t, c.URL(), "quota", "define", "--name", "q", "--window", "day", "--limit", "5")
	ok(t, c.URL(), "voucher", "create", "--campaign", "launch", "--total", "5")
	ok(t, c.URL(), "voucher", "create", "--campaign", "keyed", "--total", "2")
	ctx := t.Context()
	pool := pgcluster.Pool(t, c.URL("app"))
	used := func(member string) int64 {
		t.Helper()
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT used FROM pgquota.limit_usage('q', $1)`, member).Scan(&n))
		return n
	}
	race := func(sql string, args ...any) int64 {
		t.Helper()
		var won atomic.Int64
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var ok bool
				if err := pool.QueryRow(ctx, sql, append([]any{i}, args...)...).Scan(&ok); err != nil {
					t.Errorf("call %d: %v", i, err)
				}
				if ok {
					won.Add(1)
				}
			}()
		}
		wg.Wait()
		return won.Load()
	}

	require.EqualValues(t, 5, race(`SELECT granted FROM pgquota.grant('q', 'm', 1 + 0 * $1::int)`))
	require.EqualValues(t, 5, used("m"))
	require.EqualValues(t, 5, race(`SELECT claimed FROM pgquota.claim('launch', 'member-' || $1::int)`))

	keyed := `SELECT coalesce(grant_id, 0), coalesce(prior_grant_id, 0), granted FROM pgquota.grant_keyed('orders', 'order-1', 'q', 'k', 2)`
	var id, prior int64
	var granted bool
	require.NoError(t, pool.QueryRow(ctx, keyed).Scan(&id, &prior, &granted))
	require.True(t, granted)
	require.Positive(t, id)
	require.Zero(t, prior)
	var again int64
	require.NoError(t, pool.QueryRow(ctx, keyed).Scan(&again, &prior, &granted))
	require.Equal(t, id, prior, "the second call names the first's grant and writes nothing")
	require.EqualValues(t, 2, used("k"))

	var revoked int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT revoked FROM pgquota.revoke('q', 'm', 1)`).Scan(&revoked))
	require.EqualValues(t, 1, revoked)
	for range 2 {
		require.NoError(t, pool.QueryRow(ctx, `SELECT revoked FROM pgquota.revoke_keyed('refunds', 'r-1', 'q', 'm', 1)`).Scan(&revoked))
	}
	require.EqualValues(t, 3, used("m"), "5 granted, 1 revoked, 1 revoked once with a key")

	var compensated int64
	var now bool
	for i, want := range []int64{2, 0} {
		require.NoError(t, pool.QueryRow(ctx, `SELECT revoked_now, compensated FROM pgquota.compensate_grant($1)`, id).Scan(&now, &compensated))
		require.Equal(t, want, compensated, "call %d: units given back now", i)
		require.Equal(t, i == 0, now, "call %d", i)
	}
	require.EqualValues(t, 0, used("k"), "the keyed grant's units given back once")

	// A keyed claim twice: one voucher, the second call names the first.
	claimKeyed := `SELECT claimed, coalesce(grant_id, 0), coalesce(prior_grant_id, 0) FROM pgquota.claim_keyed('claims', 'c-1', 'keyed', 'x')`
	var claimed bool
	var claimID, claimPrior int64
	require.NoError(t, pool.QueryRow(ctx, claimKeyed).Scan(&claimed, &claimID, &claimPrior))
	require.True(t, claimed)
	require.Positive(t, claimID)
	require.NoError(t, pool.QueryRow(ctx, claimKeyed).Scan(&claimed, &again, &claimPrior))
	require.Equal(t, claimID, claimPrior)
	var taken int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE claimed) FROM (
		SELECT (pgquota.claim('keyed', 'y')).claimed UNION ALL SELECT (pgquota.claim('keyed', 'z')).claimed) s`).Scan(&taken))
	require.EqualValues(t, 1, taken, "the keyed claim took one of the 2 vouchers, once")
}
