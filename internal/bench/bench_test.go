package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/internal/scratch"
)

// newScratch creates a scratch database on the test server, dropped when
// the test ends.
func newScratch(t *testing.T) *scratch.Database {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	db, err := scratch.Create(ctx, admin, "pgquota_test_bench")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Drop(ctx)) })
	// The pools the bench's tests open on it (RunLibrary's 3 clients,
	// pgbench's 2, a setup pool), one at a time.
	pgtest.Reserve(t, 6, "the bench's pools on a scratch database")
	return db
}

// snapshot renders the rows a strategy may have changed, without
// timestamps that differ from one run to the next.
func snapshot(t *testing.T, env Env) string {
	t.Helper()
	var s string
	err := env.Pool.QueryRow(context.Background(), `
		SELECT concat_ws(E'\n',
			(SELECT format('usage: %s rows, %s used', count(*), coalesce(sum(used), 0)) FROM pgquota.usage),
			(SELECT string_agg(format('usage %s|%s|%s|%s|%s', quota_name, member, window_start, window_end, used), E'\n'
			        ORDER BY quota_name, member) FROM pgquota.usage WHERE used > 0),
			(SELECT string_agg(format('pool %s|%s|%s|%s', campaign, kind, total, claimed), E'\n' ORDER BY campaign)
			   FROM pgquota.voucher_pool),
			(SELECT string_agg(format('claim %s|%s|%s|%s', campaign, member, seq, code), E'\n' ORDER BY campaign, member)
			   FROM pgquota.voucher_claim),
			(SELECT format('leases: %s rows, fences: %s rows, fenced rows: %s', (SELECT count(*) FROM pgquota.lease),
			        (SELECT count(*) FROM pgquota.fence), (SELECT count(*) FROM pgquota.fenced_row))),
			-- Acquired leases: held, for the TTL asked, with the newest token
			-- of the sequence (tokens differ from run to run, so no value).
			(SELECT string_agg(format('lease %s|%s|%s|held %s|ttl %s|newest token %s', name, holder, attempt,
			        expires_at > clock_timestamp(), expires_at - acquired_at,
			        token = pgquota.lease_token_ceiling()), E'\n' ORDER BY name)
			   FROM pgquota.lease WHERE holder = $1),
			-- Fenced rows written since the seed (seeded with an empty value).
			(SELECT string_agg(format('fenced %s|%s|%s|%s', f.resource, f.key, f.value, f.fence_token), E'\n' ORDER BY f.resource, f.key)
			   FROM pgquota.fenced_row f WHERE f.value <> ''),
			(SELECT string_agg(format('fence %s|%s', resource, max_token), E'\n' ORDER BY resource)
			   FROM pgquota.fence WHERE resource IN (SELECT resource FROM pgquota.fenced_row WHERE value <> '')),
			-- Rate and rolling-window states (their instants differ from run to run).
			(SELECT string_agg(format('rate %s|%s', quota_name, member), E'\n' ORDER BY quota_name, member)
			   FROM pgquota.rate_state WHERE tat_us > 0),
			(SELECT string_agg(format('rolling %s|%s|%s', quota_name, member, units), E'\n' ORDER BY quota_name, member)
			   FROM pgquota.rolling_usage WHERE cardinality(units) > 0))`,
		acquireHolder).Scan(&s)
	require.NoError(t, err)
	return s
}

// effect resets the strategy's state (its Setup), runs do, and returns the
// snapshot of what changed.
func effect(t *testing.T, db *scratch.Database, s Strategy, do func(env Env, op Op)) string {
	t.Helper()
	ctx := context.Background()
	pool, err := openPool(ctx, db, 1, nil)
	require.NoError(t, err)
	defer pool.Close()
	env, err := newEnv(pool, nil)
	require.NoError(t, err)
	op, err := s.Setup(ctx, env)
	require.NoError(t, err)
	before := snapshot(t, env)
	do(env, op)
	after := snapshot(t, env)
	require.NotEqual(t, before, after, "the operation changed nothing")
	return after
}

// wantStatements is how many statements (round trips) one operation of
// each strategy sends.
var wantStatements = map[string]int{
	"grant-hot": 1, "grant-spread": 1, "grant-first": 1, "voucher-claim": 1,
	"for-update": 4, "advisory-lock": 5, "serializable": 4,
	"lease-acquire": 1, "fenced-write": 1,
	"rate-gcra": 1, "window-fixed": 1, "window-rolling": 1,
}

// TestPgbenchEquivalence checks, for every strategy, how many statements
// (round trips) one operation sends, and that the pgbench script built from
// them matches its checked-in copy (testdataScripts) and has the library's
// effect on the rows: once with the script's statements sent the way pgbench -M
// prepared sends them (unnamed parameter types, values as text), and once
// through pgbench itself (-t 1) when it is installed.
func TestPgbenchEquivalence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newScratch(t)
	_, noPgbench := LookPgbench("")
	for _, s := range Strategies() {
		t.Run(s.Name(), func(t *testing.T) {
			if r, ok := s.(redisRateStrategy); ok {
				// Redis, not PostgreSQL: the operation must be granted.
				pool, err := db.Pool(ctx, 2)
				require.NoError(t, err)
				defer pool.Close()
				op, err := r.Setup(ctx, Env{Pool: pool})
				require.NoError(t, err)
				out, err := op.Do(ctx, []int64{4242 % rateMembers})
				require.NoError(t, err)
				require.True(t, out.Granted)
				return
			}
			if base := pgbenchSide(s); base.Name() != s.Name() {
				// pgbench runs the baseline's script, checked in the
				// baseline's own subtest; the strategy's own operation must
				// work through the library.
				_, ok := Lookup(base.Name())
				require.True(t, ok, "the baseline %s is a registered strategy", base.Name())
				effect(t, db, s, func(_ Env, op Op) {
					vals := make([]int64, len(op.Vars))
					for i, v := range op.Vars {
						vals[i] = v.Min + (4242 % (v.Max - v.Min + 1))
					}
					out, err := op.Do(ctx, vals)
					require.NoError(t, err)
					require.True(t, out.Granted)
				})
				return
			}
			script, err := Capture(ctx, db, s)
			require.NoError(t, err)
			want, ok := wantStatements[s.Name()]
			require.True(t, ok, "wantStatements has no count for %s", s.Name())
			require.Len(t, script.Statements, want, "statements per operation")
			checkTestdata(t, script)
			vals := make([]int64, len(script.Vars))
			for i, v := range script.Vars {
				vals[i] = v.Min + (4242 % (v.Max - v.Min + 1))
			}

			lib := effect(t, db, s, func(_ Env, op Op) {
				out, err := op.Do(ctx, vals)
				require.NoError(t, err)
				require.True(t, out.Granted)
			})

			stmts, err := script.PgbenchSQL(vals)
			require.NoError(t, err)
			viaScript := effect(t, db, s, func(env Env, _ Op) {
				c, err := env.Pool.Acquire(ctx)
				require.NoError(t, err)
				defer c.Release()
				pc := c.Conn().PgConn()
				for i, st := range stmts {
					name := fmt.Sprintf("pgbench_equivalence_%d", i)
					_, err := pc.Prepare(ctx, name, st.SQL, nil) // parameter types left to the server
					require.NoError(t, err, st.SQL)
					params := make([][]byte, len(st.Args))
					for k, a := range st.Args {
						params[k] = []byte(a.(string))
					}
					res := pc.ExecPrepared(ctx, name, params, nil, nil).Read()
					require.NoError(t, res.Err, st.SQL)
					require.NoError(t, pc.Deallocate(ctx, name))
				}
			})
			require.Equal(t, lib, viaScript)

			if noPgbench != nil {
				t.Logf("pgbench is not installed (%v): checked through pgx only", noPgbench)
				return
			}
			viaPgbench := effect(t, db, s, func(Env, Op) {
				res, err := RunPgbench(ctx, script.WithFixedVars(vals), PgbenchOptions{
					Clients: 1, Transactions: 1, Conn: &db.Config(1).ConnConfig.Config,
				})
				require.NoError(t, err)
				require.Equal(t, int64(1), res.Transactions)
			})
			require.Equal(t, lib, viaPgbench)
		})
	}
}

// TestRunLibrary runs a short measured run: exactly N connections, every
// operation counted and granted, and the counter at least the count.
func TestRunLibrary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newScratch(t)
	s, ok := Lookup("grant-hot")
	require.True(t, ok)
	var ticks int
	res, err := RunLibrary(ctx, db, s, 3, 300*time.Millisecond, func(time.Duration) { ticks++ }, nil)
	require.NoError(t, err)
	require.Equal(t, int32(3), res.Connections)
	require.Positive(t, res.Ops)
	require.Equal(t, res.Ops, res.Granted)
	require.Zero(t, res.Errors)
	require.Positive(t, res.P50)
	require.LessOrEqual(t, res.P50, res.P99)
	require.Positive(t, ticks)

	pool, err := db.Pool(ctx, 1)
	require.NoError(t, err)
	defer pool.Close()
	var used int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT used FROM pgquota.usage WHERE member = 'hot'`).Scan(&used))
	// Operations that ended after the deadline committed but are not counted.
	require.GreaterOrEqual(t, used, res.Ops)
}

// TestRunRounds: with several rounds, every round is kept and the result
// is the median round; the fenced lock's strategies run without errors.
func TestRunRounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	var strategies []Strategy
	for _, name := range []string{"lease-acquire", "fenced-write"} {
		s, ok := Lookup(name)
		require.True(t, ok)
		strategies = append(strategies, s)
	}
	rep, err := Run(ctx, admin, Config{Strategies: strategies, Clients: []int{2}, Duration: 200 * time.Millisecond, Rounds: 3})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Rounds)
	require.Len(t, rep.Results, 2)
	for _, r := range rep.Results {
		require.Len(t, r.Rounds, 3, r.Strategy)
		var ops []float64
		for _, rd := range r.Rounds {
			ops = append(ops, rd.OpsPerSec)
			require.Zero(t, rd.PgbenchTPS)
		}
		slices.Sort(ops)
		require.Equal(t, ops[1], r.Library.OpsPerSec, r.Strategy)
		require.Zero(t, r.Library.Errors, r.Library.FirstError)
		require.Equal(t, r.Library.Ops, r.Library.Granted, "%s: every operation succeeds", r.Strategy)
		require.Nil(t, r.Pgbench)
	}

	_, err = Run(ctx, admin, Config{Clients: []int{1}, Duration: time.Second, Rounds: -1})
	require.ErrorContains(t, err, "rounds")
}

func TestMedianBy(t *testing.T) {
	t.Parallel()
	id := func(x int) float64 { return float64(x) }
	require.Equal(t, 5, medianBy([]int{9, 5, 1}, id))
	require.Equal(t, 7, medianBy([]int{9, 5, 1, 7}, id))
	require.Equal(t, 3, medianBy([]int{3}, id))
	in := []int{3, 2, 1}
	medianBy(in, id)
	require.Equal(t, []int{3, 2, 1}, in, "the input is not reordered")
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range Strategies() {
		require.NotContains(t, names, s.Name(), "duplicate")
		names = append(names, s.Name())
		require.NotEmpty(t, s.Describe())
		got, ok := Lookup(s.Name())
		require.True(t, ok)
		require.Equal(t, s, got)
	}
	require.Equal(t, []string{"grant-hot", "grant-spread", "grant-first", "for-update", "advisory-lock",
		"serializable", "voucher-claim", "lease-acquire", "fenced-write",
		"grant-hot-coalesced", "voucher-sharded",
		"rate-gcra", "window-fixed", "window-rolling", "redis-rate", "redis-rate-durable",
		"grant-spread-grouped", "grant-hot-grouped",
		"rate-gcra-hot", "rate-gcra-hot-coalesced", "rate-gcra-hot-grouped", "redis-rate-hot", "redis-rate-hot-durable"}, names)
	_, ok := Lookup("nope")
	require.False(t, ok)
	require.Equal(t, "10000", strconv.Itoa(SpreadMembers))
}
