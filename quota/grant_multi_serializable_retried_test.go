package quota_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// With SERIALIZABLE as the database's default isolation (ALTER DATABASE
// ... SET default_transaction_isolation), 40 concurrent multi-quota grants
// from two Clients on one member's rows conflict (40001): Grant owns the
// transaction, so it retries them. Every call succeeds, exactly 40 are
// granted and the day counter holds exactly 40 units.
func TestGrantMultiSerializableDefaultRetried(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	owner := pgtest.ConnectOwner(t, dbURL, 2)
	ctx := t.Context()
	var dbName string
	require.NoError(t, owner.QueryRow(ctx, "SELECT current_database()").Scan(&dbName))
	_, err := owner.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s SET default_transaction_isolation = serializable", pgx.Identifier{dbName}.Sanitize()))
	require.NoError(t, err)
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), 16)
	var iso string
	require.NoError(t, pool.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&iso))
	require.Equal(t, "serializable", iso)

	b := &testBundle{ctx: ctx, pool: pool, owner: owner}
	b.client, err = quota.New(pool, testConfig(t, nil))
	require.NoError(t, err)
	b.operator = operatorOf(t, b.client)
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr(int64(1000))})
	b.define(t, quota.Definition{Name: "rate", Window: quota.WindowRate, DefaultLimit: ptr(int64(1000)), Period: time.Hour, Burst: 1000})
	second, err := quota.New(pool, testConfig(t, nil))
	require.NoError(t, err)
	clients := []*quota.Client{b.client, second}

	var errs errList
	var mu sync.Mutex
	granted := 0
	concurrently(40, func(i int) {
		res, err := clients[i%2].Grant(ctx, quota.GrantRequest{Quotas: []string{"day", "rate"}, Member: "m", Amount: 1})
		errs.Add(err)
		if err == nil && res.Granted {
			mu.Lock()
			granted++
			mu.Unlock()
		}
	})
	errs.RequireNone(t, "multi-quota grants under SERIALIZABLE")
	require.Equal(t, 40, granted)
	sum, _ := b.usageRows(t, "day", "m")
	require.Equal(t, int64(40), sum)
}
