package voucher_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// 40 pgbench clients claim from sharded pools near sell-out through the SQL
// interface alone (pgquota.claim, pgquota.claim_keyed), in READ COMMITTED
// autocommit, with no retries by pgbench: no call fails (a FOR UPDATE that
// finds a shard full keeps its lock, and two claims waiting for each
// other's next shard used to end in 40P01 in about one run of two), and
// each pool hands out exactly its total with distinct unit numbers.
func TestClaimShardedFromSQLDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pgbench := lookPgbench(t)
	dbURL := pgtest.NewURL(t)
	b := &testBundle{ctx: context.Background(), pool: pgtest.Connect(t, dbURL, 4), owner: pgtest.ConnectOwner(t, dbURL, 1)}
	var err error
	b.client, err = quota.New(b.pool, nil)
	require.NoError(t, err)
	b.operator = operatorOf(t, b.client)

	const rounds, total, shards = 3, 50, 7
	for round := range rounds {
		for _, keyed := range []bool{false, true} {
			campaign := fmt.Sprintf("sharded-%d-%v", round, keyed)
			_, err := voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, campaign, total, shards)
			require.NoError(t, err)
			call := "SELECT claimed FROM pgquota.claim(:q, 'u' || :u);"
			if keyed {
				call = "SELECT claimed FROM pgquota.claim_keyed(:q, 'k' || :u, :q, 'u' || :u);"
			}
			script := filepath.Join(t.TempDir(), "claim.sql")
			require.NoError(t, os.WriteFile(script, []byte("\\set u random(1, 400)\n"+call+"\n"), 0o600))
			cmd := exec.CommandContext(b.ctx, pgbench, "-n", "-M", "extended", "--max-tries=1", "--failures-detailed",
				"-c", "40", "-j", "4", "-t", "10", "-D", "q="+campaign, "-f", script, dbURL)
			cmd.Env = append(os.Environ(), "PGOPTIONS=-c default_transaction_isolation=read\\ committed")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "pgbench: %s", out)
			require.Contains(t, string(out), "number of transactions actually processed: 400/400", "%s: %s", campaign, out)
			require.Contains(t, string(out), "number of failed transactions: 0 ", "%s: %s", campaign, out)

			var claims, distinct, claimed int64
			require.NoError(t, b.pool.QueryRow(b.ctx,
				`SELECT count(*), count(DISTINCT seq),
				        (SELECT sum(claimed) FROM pgquota.voucher_shard WHERE campaign = $1)
				 FROM pgquota.voucher_claim WHERE campaign = $1`, campaign).Scan(&claims, &distinct, &claimed))
			require.Equal(t, [3]int64{total, total, total}, [3]int64{claims, distinct, claimed}, campaign)
		}
	}
}
