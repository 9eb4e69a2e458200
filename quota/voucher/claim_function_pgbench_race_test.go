package voucher_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// 20 pgbench clients (from outside Go, through the SQL interface only)
// race for a counted pool of 1 voucher, each as its own member
// (:client_id), 10 times each, through pgquota.claim; and, in the same
// transactions, through pgquota.claim_keyed on another 1-voucher pool, each
// client with its own key. Exactly one claim row each, the pools count 1,
// and the keyed pool has one ledger entry per client, exactly one of them
// granted.
func TestClaimFunctionPgbenchRaceOneVoucher(t *testing.T) {
	t.Parallel()
	pgbench := lookPgbench(t)
	dbURL := pgtest.NewURL(t)
	b := &testBundle{ctx: context.Background(), pool: pgtest.Connect(t, dbURL, 4), owner: pgtest.ConnectOwner(t, dbURL, 1)}
	var err error
	b.client, err = quota.New(b.pool, nil)
	require.NoError(t, err)
	b.operator = operatorOf(t, b.client)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "one", 1)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "one-keyed", 1)
	require.NoError(t, err)

	script := filepath.Join(t.TempDir(), "claim.sql")
	require.NoError(t, os.WriteFile(script, []byte(
		"SELECT * FROM pgquota.claim('one', 'member-' || :client_id);\n"+
			"SELECT * FROM pgquota.claim_keyed('one-keyed', 'key-' || :client_id, 'one-keyed', 'member-' || :client_id);\n"), 0o600))
	const clients, perClient = 20, 10
	out, err := exec.CommandContext(b.ctx, pgbench, "-n", "--max-tries=1000", "-c", "20", "-j", "2", "-t", "10", "-f", script,
		dbURL).CombinedOutput()
	require.NoError(t, err, "pgbench: %s", out)
	require.Contains(t, string(out), "number of failed transactions: 0", "pgbench: %s", out)
	require.Contains(t, string(out), "number of transactions actually processed: 200/200", "pgbench: %s", out)

	for _, campaign := range []string{"one", "one-keyed"} {
		var claims, claimed int64
		require.NoError(t, b.pool.QueryRow(b.ctx,
			`SELECT (SELECT count(*) FROM pgquota.voucher_claim WHERE campaign = $1),
			        (SELECT claimed FROM pgquota.voucher_pool WHERE campaign = $1)`, campaign).Scan(&claims, &claimed))
		require.Equal(t, int64(1), claims, "%s: exactly one claim row after %d clients x %d claims", campaign, clients, perClient)
		require.Equal(t, int64(1), claimed, campaign)
		t.Logf("%s: %d claim row, pool claimed %d", campaign, claims, claimed)
	}
	var entries, granted int64
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT count(*), count(*) FILTER (WHERE granted) FROM pgquota.ledger_entry WHERE target = 'one-keyed'`).Scan(&entries, &granted))
	require.Equal(t, int64(clients), entries, "one ledger entry per client key")
	require.Equal(t, int64(1), granted, "exactly one keyed claim granted")
}
