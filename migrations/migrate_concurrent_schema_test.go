package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

// referenceSchema migrates a fresh empty database once, alone, and returns
// its schema snapshot.
func referenceSchema(t *testing.T) []string {
	t.Helper()
	dbURL := pgtest.NewEmptyURL(t)
	_, err := migrations.Up(context.Background(), openDB(t, dbURL, 2))
	require.NoError(t, err)
	return pgtest.SchemaSnapshot(t, pgtest.Connect(t, dbURL, 1), migrations.Schema)
}

// newPool opens a pool of at most maxConns connections on dbURL; the
// caller closes it.
func newPool(t *testing.T, dbURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	return pool
}

// diffLines returns the lines only in a and only in b.
func diffLines(a, b []string) (onlyA, onlyB []string) {
	inB := map[string]int{}
	for _, s := range b {
		inB[s]++
	}
	for _, s := range a {
		if inB[s] > 0 {
			inB[s]--
			continue
		}
		onlyA = append(onlyA, s)
	}
	inA := map[string]int{}
	for _, s := range a {
		inA[s]++
	}
	for _, s := range b {
		if inA[s] > 0 {
			inA[s]--
			continue
		}
		onlyB = append(onlyB, s)
	}
	return onlyA, onlyB
}

// Eight replicas that migrate one empty database at once, half through
// migrations.Up and half through Client.Migrate, each on its own pool as
// separate processes would, all succeed and leave exactly the schema one
// migration alone leaves: the version table, its sequence and the schema
// are created under the migration lock, never by two sessions at once
// (goose's own creation raced: an identity sequence goose_db_version_id_seq1
// and 23505 errors in 6 of 30 rounds). 20 rounds.
func TestConcurrentMigrateUpLeavesTheSameSchema(t *testing.T) {
	t.Parallel()
	const rounds, replicas = 20, 8
	want := referenceSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	differing, failed := 0, 0
	var report []string
	pgtest.Reserve(t, replicas*2, "the replicas' pools of 2, one round at a time")
	for round := range rounds {
		dbURL := pgtest.NewEmptyURL(t)
		errs := make([]error, replicas)
		var start, done sync.WaitGroup
		start.Add(1)
		var closers []func()
		for i := range replicas {
			// Pools are closed at the end of each round: 20 rounds of 8
			// replicas would exhaust the shared server's connections.
			pool := newPool(t, dbURL, 2)
			db := stdlib.OpenDBFromPool(pool)
			closers = append(closers, func() { _ = db.Close(); pool.Close() })
			done.Add(1)
			go func() {
				defer done.Done()
				start.Wait()
				if i%2 == 0 {
					_, errs[i] = migrations.Up(ctx, db)
					return
				}
				client, err := quota.New(pool, nil)
				if err == nil {
					err = client.Migrate(ctx)
				}
				errs[i] = err
			}()
		}
		start.Done()
		done.Wait()
		roundFailed := false
		for i, err := range errs {
			if err != nil {
				roundFailed = true
				report = append(report, fmt.Sprintf("round %d replica %d: %v", round, i, err))
			}
		}
		if roundFailed {
			failed++
		}
		for _, c := range closers {
			c()
		}
		check := newPool(t, dbURL, 1)
		got := pgtest.SchemaSnapshot(t, check, migrations.Schema)
		if onlyWant, onlyGot := diffLines(want, got); len(onlyWant)+len(onlyGot) > 0 {
			differing++
			report = append(report, fmt.Sprintf("round %d: schema differs from a single run: missing %q, extra %q", round, onlyWant, onlyGot))
		}
		checkDB := stdlib.OpenDBFromPool(check)
		require.Equal(t, allOnce(), appliedVersions(t, checkDB), "round %d", round)
		_ = checkDB.Close()
		check.Close()
	}
	t.Logf("%d rounds of %d concurrent migrations: %d with a schema unlike a single run's, %d with an error", rounds, replicas, differing, failed)
	require.Zero(t, differing+failed, strings.Join(report, "\n"))
}

// Client.Migrate and migrations.Up need one connection only: a pool of
// MaxConns = 1 migrates (goose's table locker took a second connection
// while goose held the first, and waited for it until the context ended).
func TestMigrateOnSingleConnectionPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client, err := quota.New(pgtest.Connect(t, pgtest.NewEmptyURL(t), 1), nil)
	require.NoError(t, err)
	require.NoError(t, client.Migrate(ctx))
	require.NoError(t, client.CheckSchema(ctx))
	require.NoError(t, client.Migrate(ctx), "a second run has nothing to do")

	db := openDB(t, pgtest.NewEmptyURL(t), 1)
	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))
	require.NoError(t, ctx.Err())
}
