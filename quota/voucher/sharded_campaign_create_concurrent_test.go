package voucher_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// Replicas that start at once each make sure their sharded pool exists.
// With the database's default isolation at SERIALIZABLE (which the suite
// must pass), the creates that lose the race fail with SQLSTATE 40001;
// CreateShardedCampaign owns its transaction, so it must retry them, as
// CreateCampaign and ImportCodes do, and return the existing pool.
func TestCreateShardedPoolConcurrentSerializable(t *testing.T) {
	t.Parallel()
	// Operator work alone: as the operator's role under
	// PGQUOTA_TEST_APP_ROLE=1.
	dbURL := pgtest.NewURL(t)
	if pgtest.AppRoleMode() {
		dbURL = pgtest.OperatorURL(t, dbURL)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 8
	pgtest.Reserve(t, int(cfg.MaxConns), "a serializable pool of 8")
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	client, err := quota.New(pool, nil)
	require.NoError(t, err)

	for round := range 5 {
		campaign := "p" + string(rune('a'+round))
		errs := make([]error, 8)
		concurrently(8, func(i int) {
			_, errs[i] = voucherOf(t, client).CreateShardedCampaign(context.Background(), campaign, 100, 4)
		})
		for i, err := range errs {
			require.NoError(t, err, "round %d, replica %d", round, i)
		}
		p, err := voucherOf(t, client).Campaign(context.Background(), campaign)
		require.NoError(t, err)
		require.Equal(t, 4, p.Shards)
	}
}
