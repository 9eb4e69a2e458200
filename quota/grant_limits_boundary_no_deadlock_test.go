package quota_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// defineBoundaryPair defines dA, a fixed window of 1 ms (a boundary passes
// during most lock waits), and dB, a rate: the grant against both that
// used to lock dA's new window after dB's row.
func defineBoundaryPair(t *testing.T, b *testBundle) {
	t.Helper()
	b.define(t, quota.Definition{Name: "dA", Window: quota.WindowFixed, DefaultLimit: ptr(int64(3)), Period: time.Millisecond})
	b.define(t, quota.Definition{Name: "dB", Window: quota.WindowRate, DefaultLimit: ptr(int64(1000)), Period: time.Second, Burst: 50})
}

// 16 pgbench clients, READ COMMITTED autocommit, no retries, call
// pgquota.grant_limits(ARRAY['dA','dB'], 'm', 1, NULL) and
// pgquota.grant_limits_batch for both quotas and two members: no
// transaction fails (no 40P01), and the counters and the TAT agree with
// the calls reported granted.
func TestGrantLimitsFromSQLAcrossBoundariesDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pgbench := lookPgbench(t)
	dbURL := pgtest.NewURL(t)
	b := &testBundle{ctx: t.Context(), pool: pgtest.Connect(t, dbURL, 4), owner: pgtest.ConnectOwner(t, dbURL, 2)}
	var err error
	b.client, err = quota.New(b.pool, nil)
	require.NoError(t, err)
	b.operator = operatorOf(t, b.client)
	defineBoundaryPair(t, b)
	_, err = b.owner.Exec(b.ctx, `CREATE TABLE public.grant_log (member text NOT NULL, granted boolean NOT NULL);
		GRANT SELECT, INSERT ON public.grant_log TO PUBLIC`)
	require.NoError(t, err)

	dir := t.TempDir()
	single := filepath.Join(dir, "single.sql")
	require.NoError(t, os.WriteFile(single, []byte(
		"INSERT INTO public.grant_log SELECT 'm', bool_and(granted) FROM pgquota.grant_limits(ARRAY['dA','dB'], 'm', 1, NULL);\n"), 0o600))
	batch := filepath.Join(dir, "batch.sql")
	require.NoError(t, os.WriteFile(batch, []byte(
		"INSERT INTO public.grant_log SELECT g.member, bool_and(g.granted) FROM (\n"+
			"  SELECT (ARRAY['n','m'])[req_index] AS member, req_index, granted FROM pgquota.grant_limits_batch(\n"+
			"    ARRAY['dB','dA','dA','dB'], ARRAY[1,3], ARRAY[2,2], ARRAY['n','m'], ARRAY[1,1]::bigint[], ARRAY[-1,-1]::bigint[])) g\n"+
			"GROUP BY g.member, g.req_index;\n"), 0o600))
	// pgbench runs as the owner of the test database (dbURL); with
	// PGQUOTA_TEST_APP_ROLE=1 the reads below run as the application role.
	cmd := exec.CommandContext(b.ctx, pgbench, "-n", "-M", "extended", "--max-tries=1", "--failures-detailed",
		"-c", "16", "-j", "4", "-t", "100", "-f", single, "-f", batch, dbURL)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c default_transaction_isolation=read\\ committed")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pgbench: %s", out)
	require.Contains(t, string(out), "number of transactions actually processed: 1600/1600", "pgbench: %s", out)
	require.Contains(t, string(out), "number of failed transactions: 0 ", "pgbench: %s", out)

	for _, m := range []string{"m", "n"} {
		var granted, counters int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FILTER (WHERE granted) FROM public.grant_log WHERE member = $1),
			(SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = 'dA' AND member = $1)`, m).Scan(&granted, &counters))
		require.Equal(t, granted, counters, "member %s: dA's counters hold the grants reported", m)
		var most int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(max(used), 0) FROM pgquota.usage WHERE quota_name = 'dA'`).Scan(&most))
		require.LessOrEqual(t, most, int64(3))
		t.Logf("member %s: %d granted", m, granted)
	}
}

// 16 goroutines grant against dA and dB in their own READ COMMITTED
// transactions (GrantTx and GrantBatchTx, which return a deadlock
// unchanged instead of retrying it), names in both orders: no call fails,
// none with 40P01.
func TestGrantLimitsFromGoTransactionsAcrossBoundariesDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	defineBoundaryPair(t, b)
	var deadlocks, failures atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			names := []string{"dA", "dB"}
			if g%2 == 1 {
				names = []string{"dB", "dA"}
			}
			for i := range 60 {
				err := pgx.BeginTxFunc(b.ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
					if i%3 == 2 {
						outs, err := b.client.GrantBatchTx(b.ctx, tx, []quota.GrantRequest{
							{Quotas: names, Member: "m", Amount: 1},
							{Quota: "dA", Member: "n", Amount: 1},
							{Quotas: []string{names[1], names[0]}, Member: "n", Amount: 1},
						})
						if err == nil {
							for _, o := range outs {
								err = errors.Join(err, o.Err)
							}
						}
						return err
					}
					_, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quotas: names, Member: "m", Amount: 1})
					return err
				})
				countCallError(t, &failures, &deadlocks, g, i, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d calls failed, %d with 40P01", failures.Load(), 16*60, deadlocks.Load())
	require.Zero(t, deadlocks.Load(), "40P01 from Go callers")
	require.Zero(t, failures.Load(), "failed calls")
}

// countCallError counts a failed call of goroutine g's call i in failures,
// and in deadlocks when it ended in 40P01, logging the first five.
func countCallError(t *testing.T, failures, deadlocks *atomic.Int64, g, i int, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if failures.Add(1) <= 5 {
		t.Logf("goroutine %d call %d: %v", g, i, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
		deadlocks.Add(1)
	}
}
