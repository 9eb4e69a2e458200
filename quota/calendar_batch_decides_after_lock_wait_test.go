package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// tableClock makes pgquota.clock() in this test's database read
// public.test_clock_at, starting at at: a transaction that updates the row
// moves the clock for everyone when it commits.
func (b *testBundle) tableClock(t *testing.T, at time.Time) {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, `CREATE TABLE public.test_clock_at (at timestamptz NOT NULL);
		GRANT SELECT, UPDATE ON public.test_clock_at TO PUBLIC`)
	require.NoError(t, err)
	_, err = b.owner.Exec(b.ctx, `INSERT INTO public.test_clock_at VALUES ($1)`, at)
	require.NoError(t, err)
	_, err = b.owner.Exec(b.ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT at FROM public.test_clock_at $$`)
	require.NoError(t, err)
}

// A calendar batch (GrantBatch, through Go's batch statement) that waits
// for a counter locked by a transaction which moves the clock past an hour
// boundary before it commits is decided once it holds the lock, at the
// new instant, in the new hour: granted (the new hour is empty), with
// DecidedAt the instant after the wait and its window holding it. It used
// to be decided at the instant read before the wait, in the old hour: a
// denial with RetryAfter 1 ms, for a window that had ended before the
// decision was taken. With one counter, and with two (an hour and a day).
func TestCalendarBatchDecidesAfterItsLockWait(t *testing.T) {
	t.Parallel()
	before := time.Date(2026, 3, 1, 12, 59, 59, 999000, time.UTC)
	after := time.Date(2026, 3, 1, 13, 0, 0, 500000000, time.UTC)
	hour := time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		reqs []quota.GrantRequest
	}{
		{"one counter", []quota.GrantRequest{{Quota: "h", Member: "m", Amount: 1}}},
		{"two counters", []quota.GrantRequest{{Quota: "h", Member: "m", Amount: 1}, {Quota: "d", Member: "m", Amount: 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4)
			b.define(t, quota.Definition{Name: "h", Window: quota.WindowHour, DefaultLimit: ptr(int64(1))})
			b.define(t, quota.Definition{Name: "d", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
			b.tableClock(t, before)

			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			r, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "h", Member: "m", Amount: 1})
			require.NoError(t, err)
			require.True(t, r.Granted)
			require.Equal(t, hour, r.WindowEnd.UTC())
			_, err = tx.Exec(b.ctx, `UPDATE public.test_clock_at SET at = $1`, after)
			require.NoError(t, err)

			type result struct {
				outs []quota.BatchOutcome
				err  error
			}
			done := make(chan result, 1)
			go func() {
				outs, err := b.client.GrantBatch(b.ctx, c.reqs)
				done <- result{outs, err}
			}()
			// The batch waits for the counter the transaction holds. Read
			// as the server's role: the database's owner sees no other
			// role's wait state (PGQUOTA_TEST_APP_ROLE=1).
			var dbName string
			require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT current_database()`).Scan(&dbName))
			su, err := pgx.Connect(b.ctx, pgtest.BaseURL(t))
			require.NoError(t, err)
			defer func() { _ = su.Close(context.Background()) }()
			require.Eventually(t, func() bool {
				var n int
				err := su.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%usage_grant_batch%'`, dbName).Scan(&n)
				return err == nil && n == 1
			}, 30*time.Second, 10*time.Millisecond, "the batch never waited for the counter")
			require.NoError(t, tx.Commit(b.ctx))

			var res result
			select {
			case res = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the batch did not return")
			}
			require.NoError(t, res.err)
			require.Len(t, res.outs, len(c.reqs))
			h := res.outs[0]
			require.NoError(t, h.Err)
			require.Equal(t, after, h.DecidedAt.UTC(), "decided at the instant after the lock wait")
			require.True(t, h.Granted, "the new hour has room: %+v", h.GrantResult)
			require.Equal(t, hour, h.WindowStart.UTC())
			require.Equal(t, hour.Add(time.Hour), h.WindowEnd.UTC())
			require.Zero(t, h.RetryAfter)
			require.Equal(t, hour.Add(time.Hour).Sub(after), h.ResetAfter)
			if len(res.outs) == 2 {
				d := res.outs[1]
				require.NoError(t, d.Err)
				require.True(t, d.Granted)
				require.Equal(t, after, d.DecidedAt.UTC())
				require.Equal(t, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), d.WindowStart.UTC())
				require.Equal(t, int64(1), d.Used)
			}
			var old, cur int64
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
				coalesce((SELECT used FROM pgquota.usage WHERE quota_name = 'h' AND member = 'm' AND window_end = $1), -1),
				coalesce((SELECT used FROM pgquota.usage WHERE quota_name = 'h' AND member = 'm' AND window_start = $1), -1)`, hour).Scan(&old, &cur))
			require.Equal(t, int64(1), old, "the old hour holds the transaction's grant")
			require.Equal(t, int64(1), cur, "the new hour holds the batch's grant")
		})
	}
}
