package quota_test

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// eqCall is one request of a batch of pgquota.grant_limits_batch.
type eqCall struct {
	quotas []string
	member string
	amount int64
	limit  int64 // -1: none
}

// TestBatchSetEquivalence proves that pgquota.grant_limits_batch (00025),
// which locks and writes each state row once per batch and decides its
// requests in memory, gives every request the rows pgquota.grant_limits_row
// gives it when the requests run one at a time in array order, and leaves
// the same rows: random batches (a hot member and spread ones; rate,
// fixed, rolling and calendar quotas, alone and together; amounts over
// the limit and the burst; call limits; an unknown quota), at a fixed
// clock moved between rounds so windows roll and rates refill. Each round
// runs the batch in a transaction that is rolled back, then the calls one
// at a time in one that commits, so the next round starts from the
// reference's state.
func TestBatchSetEquivalence(t *testing.T) {
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "r", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Second, Burst: 3})
	b.define(t, quota.Definition{Name: "r7", Window: quota.WindowRate, DefaultLimit: ptr(int64(7)), Period: 10 * time.Second})
	b.define(t, quota.Definition{Name: "f", Window: quota.WindowFixed, DefaultLimit: ptr(int64(6)), Period: time.Minute})
	b.define(t, quota.Definition{Name: "w", Window: quota.WindowRolling, DefaultLimit: ptr(int64(5)), Period: 30 * time.Second})
	b.define(t, quota.Definition{Name: "h", Window: quota.WindowHour, DefaultLimit: ptr(int64(8))})
	_, err := b.owner.Exec(b.ctx, `
		CREATE TABLE public.eq_now (at timestamptz NOT NULL);
		INSERT INTO public.eq_now VALUES ('2026-03-01T10:59:50Z');
		GRANT SELECT ON public.eq_now TO PUBLIC;
		INSERT INTO pgquota.quota_override (quota_name, member, limit_value) VALUES ('r', 'm2', 2), ('w', 'hot', 9);
		CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
			LANGUAGE sql VOLATILE AS $$ SELECT at FROM public.eq_now $$`)
	require.NoError(t, err)

	names := []string{"r", "r7", "f", "w", "h"}
	for _, seed := range []int64{1, 2, 3, 4, 5, 6, 7, 8} {
		rng := rand.New(rand.NewSource(seed))
		for round := 0; round < 5; round++ {
			step := time.Duration(rng.Intn(4000)) * time.Millisecond
			if rng.Intn(4) == 0 {
				step += 61 * time.Second // a fixed window and the hour roll over
			}
			_, err := b.owner.Exec(b.ctx, `UPDATE public.eq_now SET at = at + $1::bigint * interval '1 microsecond'`, step.Microseconds())
			require.NoError(t, err)

			calls := make([]eqCall, 1+rng.Intn(60))
			for i := range calls {
				c := eqCall{member: "hot", amount: 1 + int64(rng.Intn(3)), limit: -1}
				if rng.Intn(10) < 4 {
					c.member = fmt.Sprintf("m%d", 1+rng.Intn(4))
				}
				if rng.Intn(8) == 0 {
					c.amount = 4 + int64(rng.Intn(8)) // above a burst or a limit
				}
				if rng.Intn(6) == 0 {
					c.limit = int64(rng.Intn(7))
				}
				perm := rng.Perm(len(names))
				for _, p := range perm[:1+rng.Intn(3)] {
					c.quotas = append(c.quotas, names[p])
				}
				if rng.Intn(40) == 0 {
					c.quotas = append(c.quotas, "missing")
				}
				calls[i] = c
			}
			what := fmt.Sprintf("seed %d round %d (%d calls)", seed, round, len(calls))

			batchRows, batchState := eqBatch(t, b, calls)
			seqRows, seqState := eqOneAtATime(t, b, calls)
			require.Equal(t, seqRows, batchRows, "%s: per-call rows", what)
			require.Equal(t, seqState, batchState, "%s: final rows", what)
		}
	}
}

const eqRowCols = `g.ord, g.quota_name, g.kind, g.found, g.decided, g.limit_value, g.burst, g.period_us, g.fits, g.granted,
	g.used, g.remaining, g.window_start, g.window_end, g.retry_after_us, g.reset_after_us, g.decided_at`

// eqState reads the state rows every kind leaves, as text; a row's
// updated_at is the clock's instant when a grant wrote it, else the
// transaction's start (a row created at its initial state and left as is),
// shown as "initial".
func eqState(t *testing.T, tx pgx.Tx) []string {
	t.Helper()
	rows, err := tx.Query(t.Context(), `
		WITH c AS (SELECT pgquota.clock() AS at)
		SELECT 'rate ' || row(quota_name, member, tat_us, CASE WHEN updated_at = c.at THEN updated_at::text ELSE 'initial' END)::text FROM pgquota.rate_state, c
		UNION ALL SELECT 'rolling ' || row(quota_name, member, stamps, units, CASE WHEN updated_at = c.at THEN updated_at::text ELSE 'initial' END)::text FROM pgquota.rolling_usage, c
		UNION ALL SELECT 'usage ' || row(quota_name, member, window_start, window_end, used, CASE WHEN updated_at = c.at THEN updated_at::text ELSE 'initial' END)::text FROM pgquota.usage, c
		UNION ALL SELECT 'lock ' || row(quota_name, member)::text FROM pgquota.counter_lock
		ORDER BY 1`)
	require.NoError(t, err)
	s, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return s
}

func eqBatch(t *testing.T, b *testBundle, calls []eqCall) ([]string, []string) {
	t.Helper()
	var qn, members []string
	var firsts, counts []int32
	var amounts, limits []int64
	for _, c := range calls {
		firsts = append(firsts, int32(len(qn)+1))
		counts = append(counts, int32(len(c.quotas)))
		qn = append(qn, c.quotas...)
		members = append(members, c.member)
		amounts = append(amounts, c.amount)
		limits = append(limits, c.limit)
	}
	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	rows, err := tx.Query(b.ctx, `SELECT g.req_index || ' ' || row(`+eqRowCols+`)::text
		FROM pgquota.grant_limits_batch($1, $2, $3, $4, $5, $6) g`, qn, firsts, counts, members, amounts, limits)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got, eqState(t, tx)
}

func eqOneAtATime(t *testing.T, b *testBundle, calls []eqCall) ([]string, []string) {
	t.Helper()
	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	var got []string
	for i, c := range calls {
		var lim *int64
		if c.limit >= 0 {
			lim = &c.limit
		}
		rows, err := tx.Query(b.ctx, `SELECT $5::integer || ' ' || row(`+eqRowCols+`)::text
			FROM pgquota.grant_limits_row($1, $2, $3, $4) g ORDER BY g.ord`, c.quotas, c.member, c.amount, lim, i+1)
		require.NoError(t, err)
		r, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		got = append(got, r...)
	}
	state := eqState(t, tx)
	require.NoError(t, tx.Commit(b.ctx))
	return got, state
}
