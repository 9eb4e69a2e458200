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
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// defineCalendarPair defines cA, an hour window, and cB, a day window
// (names in that order), limits no call reaches, and makes
// pgquota.clock() move on 10 minutes at every reading: an hour boundary
// passes every 6 readings, mostly while cB's day goes on, so a call that
// waited for a lock often finds cA in a new window and cB in the old one.
func defineCalendarPair(t *testing.T, b *testBundle) {
	t.Helper()
	b.define(t, quota.Definition{Name: "cA", Window: quota.WindowHour, DefaultLimit: ptr(int64(1_000_000_000))})
	b.define(t, quota.Definition{Name: "cB", Window: quota.WindowDay, DefaultLimit: ptr(int64(1_000_000_000))})
	b.stepClock(t, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), 10*time.Minute)
}

// 16 pgbench clients, READ COMMITTED autocommit, no retries, call
// pgquota.grant_limits(ARRAY['cA','cB'], 'm', 1, NULL) and Go's calendar
// batch statement pgquota.usage_grant_batch for both counters of m: no
// transaction fails (no 40P01), every batch decision's window holds its
// decided_at, and the counters hold the grants reported.
func TestCalendarBatchFromSQLAcrossBoundariesDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pgbench := lookPgbench(t)
	dbURL := pgtest.NewURL(t)
	b := &testBundle{ctx: t.Context(), pool: pgtest.Connect(t, dbURL, 4), owner: pgtest.ConnectOwner(t, dbURL, 2)}
	var err error
	b.client, err = quota.New(b.pool, nil)
	require.NoError(t, err)
	b.operator = operatorOf(t, b.client)
	defineCalendarPair(t, b)
	_, err = b.owner.Exec(b.ctx, `
		CREATE TABLE public.limits_log (granted boolean NOT NULL);
		CREATE TABLE public.batch_log (quota_name text NOT NULL, window_start timestamptz NOT NULL, window_end timestamptz NOT NULL,
			decided_at timestamptz NOT NULL, granted bigint NOT NULL);
		GRANT SELECT, INSERT ON public.limits_log, public.batch_log TO PUBLIC`)
	require.NoError(t, err)

	dir := t.TempDir()
	single := filepath.Join(dir, "single.sql")
	require.NoError(t, os.WriteFile(single, []byte(
		"INSERT INTO public.limits_log SELECT bool_and(granted) FROM pgquota.grant_limits(ARRAY['cA','cB'], 'm', 1, NULL);\n"), 0o600))
	batch := filepath.Join(dir, "batch.sql")
	require.NoError(t, os.WriteFile(batch, []byte(
		"INSERT INTO public.batch_log SELECT (ARRAY['cB','cA'])[b.counter_index], b.window_start, b.window_end, b.decided_at,\n"+
			"  b.used_after - b.used_before FROM pgquota.usage_grant_batch(\n"+
			"    ARRAY['cB','cA'], ARRAY['m','m'], ARRAY[1,2], ARRAY[1,1], ARRAY[1,1]::bigint[], ARRAY[-1,-1]::bigint[]) b;\n"), 0o600))
	cmd := exec.CommandContext(b.ctx, pgbench, "-n", "-M", "extended", "--max-tries=1", "--failures-detailed",
		"-c", "16", "-j", "4", "-t", "100", "-f", single, "-f", batch, dbURL)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c default_transaction_isolation=read\\ committed")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pgbench: %s", out)
	require.Contains(t, string(out), "number of transactions actually processed: 1600/1600", "pgbench: %s", out)
	require.Contains(t, string(out), "number of failed transactions: 0 ", "pgbench: %s", out)

	var outside int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM public.batch_log
		WHERE NOT (window_start <= decided_at AND decided_at < window_end)`).Scan(&outside))
	require.Zero(t, outside, "batch decisions outside their window")
	for _, q := range []string{"cA", "cB"} {
		var reported, counters int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
			(SELECT count(*) FILTER (WHERE granted) FROM public.limits_log) + (SELECT coalesce(sum(granted), 0) FROM public.batch_log WHERE quota_name = $1),
			(SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = $1 AND member = 'm')`, q).Scan(&reported, &counters))
		require.Equal(t, reported, counters, "%s: the counters hold the grants reported", q)
		require.Positive(t, counters)
		t.Logf("%s: %d granted", q, counters)
	}
}

// 16 goroutines, each in its own READ COMMITTED transactions (GrantTx and
// GrantBatchTx return a deadlock instead of retrying it), grant against cA
// and cB together and in batches of both calendar counters: no call fails,
// none with 40P01, and every batch outcome is decided in its window.
func TestCalendarBatchFromGoTransactionsAcrossBoundariesDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	defineCalendarPair(t, b)
	var deadlocks, failures, outside atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			names := []string{"cA", "cB"}
			if g%2 == 1 {
				names = []string{"cB", "cA"}
			}
			for i := range 60 {
				err := pgx.BeginTxFunc(b.ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
					if i%2 == 1 {
						outs, err := b.client.GrantBatchTx(b.ctx, tx, []quota.GrantRequest{
							{Quota: names[0], Member: "m", Amount: 1},
							{Quota: names[1], Member: "m", Amount: 1},
						})
						if err == nil {
							for _, o := range outs {
								err = errors.Join(err, o.Err)
								if o.Err == nil && (o.DecidedAt.Before(o.WindowStart) || !o.DecidedAt.Before(o.WindowEnd)) {
									outside.Add(1)
								}
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
	require.Zero(t, outside.Load(), "batch outcomes decided outside their window")
}
