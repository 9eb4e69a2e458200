//go:build citus

// These tests start a Citus coordinator and workers (internal/cituscluster,
// which needs citus.so): they build with -tags citus, in CI's Citus pass.

package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// wantCitus is how every pgquota table must be distributed after Up on
// Citus, written out here independently of the plan in citus.go: "reference",
// "local" (not in citus_tables), or the distribution column and the
// colocation group (tables of a group share their colocation id, groups do
// not).
var wantCitus = map[string]struct{ kind, column, group string }{
	"pgquota_migrations":   {kind: "local"},
	"quota":                {kind: "reference"},
	"quota_override":       {kind: "reference"},
	"quota_shape":          {kind: "reference"},
	"quota_shape_defined":  {kind: "reference"},
	"lease_epoch":          {kind: "reference"},
	"fence_guard_resource": {kind: "reference"},
	"fence_secret":         {kind: "reference"},
	"function_grant":       {kind: "reference"},
	"ledger":               {kind: "reference"},
	"ledger_outcome":       {kind: "reference"},
	"usage":                {"distributed", "member", "usage"},
	"rolling_usage":        {"distributed", "member", "usage"},
	"rate_state":           {"distributed", "member", "usage"},
	"counter_lock":         {"distributed", "member", "usage"},
	"lease":                {"distributed", "name", "lease"},
	"fence":                {"distributed", "resource", "lease"},
	"fenced_row":           {"distributed", "resource", "lease"},
	"lease_waiter":         {"distributed", "name", "lease"},
	"semaphore":            {"distributed", "name", "lease"},
	"voucher_pool":         {"distributed", "campaign", "voucher"},
	"voucher_claim":        {"distributed", "campaign", "voucher"},
	"voucher_code":         {"distributed", "campaign", "voucher"},
	"voucher_shard":        {"distributed", "campaign", "voucher"},
	"outbox":               {kind: "local"},
	"outbox_claimed":       {kind: "local"},
}

type citusRow struct {
	Table      string
	Kind       string
	Column     string
	Colocation int64
	Shards     int64
}

// citusTables reads citus_tables for schema pgquota's tables, and every
// table of the schema that is not a shard (those Citus does not know are
// "local"), by name.
func citusTables(t *testing.T, db *sql.DB) map[string]citusRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := db.QueryContext(ctx, `
		SELECT c.relname::text, coalesce(ct.citus_table_type, 'local'), coalesce(ct.distribution_column, ''),
		       coalesce(ct.colocation_id, 0), coalesce(ct.shard_count, 0)
		FROM pg_class c LEFT JOIN citus_tables ct ON ct.table_name = c.oid::regclass
		WHERE c.relnamespace = 'pgquota'::regnamespace AND c.relkind IN ('r', 'p')
		  AND NOT relation_is_a_known_shard(c.oid)
		ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]citusRow{}
	for rows.Next() {
		var r citusRow
		require.NoError(t, rows.Scan(&r.Table, &r.Kind, &r.Column, &r.Colocation, &r.Shards))
		out[r.Table] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// requirePlanned checks that every pgquota table is distributed as
// wantCitus says, and logs each one.
func requirePlanned(t *testing.T, got map[string]citusRow) {
	t.Helper()
	require.Len(t, got, len(wantCitus), "pgquota's tables: %v", got)
	groups := map[string]int64{}
	seen := map[int64]string{}
	for name, want := range wantCitus {
		r, ok := got[name]
		require.True(t, ok, "table pgquota.%s exists", name)
		require.Equal(t, want.kind, r.Kind, "pgquota.%s", name)
		if want.kind != "distributed" {
			continue
		}
		require.Equal(t, want.column, r.Column, "pgquota.%s's distribution column", name)
		require.Positive(t, r.Shards, "pgquota.%s has shards", name)
		if id, ok := groups[want.group]; ok {
			require.Equal(t, id, r.Colocation, "pgquota.%s is colocated with the %s group", name, want.group)
		} else {
			require.NotContains(t, seen, r.Colocation, "pgquota.%s's colocation group %d is the %s group's alone", name, r.Colocation, want.group)
			groups[want.group], seen[r.Colocation] = r.Colocation, want.group
		}
	}
	names := make([]string, 0, len(got))
	for name := range got {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r := got[name]
		t.Logf("pgquota.%-22s %-11s %-9s colocation %d, %d shards", r.Table, r.Kind, r.Column, r.Colocation, r.Shards)
	}
}

// foreignKeysOf lists the foreign keys of schema pgquota with their
// definitions (on Citus, without those of the coordinator's shards).
func foreignKeysOf(t *testing.T, db *sql.DB, citus bool) []string {
	t.Helper()
	q := `SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE contype = 'f' AND connamespace = 'pgquota'::regnamespace`
	if citus {
		q += ` AND NOT relation_is_a_known_shard(conrelid)`
	}
	return queryStrings(t, db, q+` ORDER BY 1`)
}

// shardPlacements lists every shard of pgquota's tables with the node it
// is on, to see that a run changed nothing.
func shardPlacements(t *testing.T, db *sql.DB) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT shard_name::text || '@' || nodeport FROM citus_shards
		WHERE table_name::text LIKE 'pgquota.%' ORDER BY 1`)
}

func citusDB(t *testing.T, c *cituscluster.Cluster) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(c.Pool())
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Up on a Citus coordinator applies every migration and distributes every
// pgquota table as planned; a second run applies and changes nothing; a
// worker added afterwards changes nothing either, and a third run is fine
// on the grown cluster, with the library's read of the distribution
// (migrations.ReadDistribution) agreeing with citus_tables.
func TestCitusUpDistributesEveryTable(t *testing.T) {
	c := cituscluster.StartWith(t, 2, map[string]string{"citus.shard_count": "4"})
	ctx := context.Background()
	db := citusDB(t, c)

	// The foreign keys as the migrations create them, on plain
	// PostgreSQL (Up drops those of the tables it distributes and adds
	// them back).
	plain := pgtest.NewEmptyURL(t)
	plainDB, err := sql.Open("pgx", plain)
	require.NoError(t, err)
	t.Cleanup(func() { _ = plainDB.Close() })
	_, err = migrations.Up(ctx, plainDB)
	require.NoError(t, err)
	fks := foreignKeysOf(t, plainDB, false)
	require.Len(t, fks, 10)

	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))
	require.Equal(t, fks, foreignKeysOf(t, db, true), "the foreign keys are back, as they were")
	var shardTyped int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_type ty ON ty.oid = p.prorettype
		WHERE p.pronamespace = 'pgquota'::regnamespace AND ty.typrelid <> 0 AND relation_is_a_known_shard(ty.typrelid)`).Scan(&shardTyped))
	require.Zero(t, shardTyped, "no pgquota function returns a shard's row type")
	first := citusTables(t, db)
	requirePlanned(t, first)
	placed := shardPlacements(t, db)
	require.NotEmpty(t, placed)

	res, err = migrations.Up(ctx, db)
	require.NoError(t, err, "second run")
	require.Empty(t, res, "second run applies nothing")
	require.Equal(t, first, citusTables(t, db), "second run changes no distribution")
	require.Equal(t, placed, shardPlacements(t, db), "second run moves no shard")

	w := c.AddWorker()
	require.Len(t, c.ActiveWorkers(), 3)
	res, err = migrations.Up(ctx, db)
	require.NoError(t, err, "run after adding worker %d", w.Port)
	require.Empty(t, res)
	require.Equal(t, first, citusTables(t, db), "a run on the grown cluster changes no distribution")

	dist, err := migrations.ReadDistribution(ctx, db)
	require.NoError(t, err)
	require.Len(t, dist, len(wantCitus))
	for _, d := range dist {
		want := wantCitus[d.Table]
		require.Equal(t, want.kind, d.Method, "%s", d.Table)
		require.Equal(t, want.column, d.Column, "%s", d.Table)
		if d.ColocatedWith != "" {
			require.Equal(t, want.group, wantCitus[d.ColocatedWith].group, "%s is colocated with %s", d.Table, d.ColocatedWith)
		}
		t.Logf("ReadDistribution: pgquota.%s: %s", d.Table, d)
	}
}

// A table that a migration creates in schema pgquota without adding it to
// the Citus plan fails Up, naming it, and nothing is distributed in that
// run (the one transaction rolls back); a table Citus refuses rolls back
// the whole run too; once both are fixed, Up distributes what is left.
func TestCitusUpFailsNamingUnplannedTable(t *testing.T) {
	c := cituscluster.Start(t, 1)
	ctx := context.Background()
	db := citusDB(t, c)
	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, res, len(allOnce()))

	// Stands for a future migration's table: created as a plain table,
	// and one planned table made plain again, to see the run roll back.
	c.Exec(`CREATE TABLE pgquota.future_thing (id bigint PRIMARY KEY);
		SELECT undistribute_table('pgquota.semaphore')`)
	_, err = migrations.Up(ctx, db)
	require.Error(t, err)
	t.Logf("Up: %v", err)
	var ue *migrations.UnplannedTableError
	require.True(t, errors.As(err, &ue), "%T: %v", err, err)
	require.Equal(t, []string{"future_thing"}, ue.Tables)
	require.ErrorContains(t, err, "table pgquota.future_thing is not in pgquota's Citus plan (citusPlan in migrations/citus.go)")
	got := citusTables(t, db)
	require.Equal(t, "local", got["future_thing"].Kind)
	require.Equal(t, "local", got["semaphore"].Kind, "the failed run distributed nothing")

	// A table Citus refuses half way (a trigger, without
	// citus.enable_unsafe_triggers) rolls back the whole run:
	// fence_secret, made a reference table before function_grant in the
	// same transaction, is plain again.
	c.Exec(`DROP TABLE pgquota.future_thing;
		SELECT undistribute_table('pgquota.fence_secret');
		SELECT undistribute_table('pgquota.function_grant');
		CREATE FUNCTION pgquota.test_noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
		CREATE TRIGGER test_noop BEFORE INSERT ON pgquota.function_grant FOR EACH ROW EXECUTE FUNCTION pgquota.test_noop()`)
	fks := foreignKeysOf(t, db, true)
	_, err = migrations.Up(ctx, db)
	require.Error(t, err)
	t.Logf("Up: %v", err)
	require.ErrorContains(t, err, "create_reference_table('pgquota.function_grant')")
	got = citusTables(t, db)
	require.Equal(t, "local", got["fence_secret"].Kind, "the failed run distributed nothing")
	require.Equal(t, "local", got["function_grant"].Kind)
	require.Equal(t, fks, foreignKeysOf(t, db, true))

	c.Exec(`DROP TRIGGER test_noop ON pgquota.function_grant; DROP FUNCTION pgquota.test_noop()`)
	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	got = citusTables(t, db)
	require.Equal(t, "reference", got["fence_secret"].Kind)
	require.Equal(t, "reference", got["function_grant"].Kind)
	require.Equal(t, "distributed", got["semaphore"].Kind)
	require.Equal(t, got["lease"].Colocation, got["semaphore"].Colocation)
	require.Equal(t, "distributed", got["usage"].Kind, "tables distributed before are left as they were")
}

// The Citus bodies (migrations/citus/calls.sql) replace functions the
// migrations made: a body whose function is gone (or whose arguments
// changed) would add a function of its own, and Up fails naming the file,
// changing nothing.
func TestCitusUpRefusesACitusBodyWithoutItsFunction(t *testing.T) {
	c := cituscluster.Start(t, 1)
	ctx := context.Background()
	db := citusDB(t, c)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	var body string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT prosrc FROM pg_proc WHERE oid = 'pgquota.lease_acquire(interval,text,text,text)'::regprocedure`).Scan(&body))
	require.Contains(t, body, "v_now := pgquota.clock();", "the Citus body is in place")

	c.Exec(`DROP FUNCTION pgquota.quota_override_delete(text, text)`)
	_, err = migrations.Up(ctx, db)
	require.ErrorContains(t, err, "migrations/citus/calls.sql created 1 function(s) instead of replacing the migrations' own")
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'quota_override_delete'`).Scan(&n))
	require.Zero(t, n, "nothing was changed")
}

// withoutReplicaIdentity lists the tables and shards of schema pgquota on
// one node that have no replica identity (no primary key, no REPLICA
// IDENTITY USING INDEX, not FULL): logical replication, and so a Citus
// rebalance, cannot move them.
func withoutReplicaIdentity(t *testing.T, db *sql.DB) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT c.relname::text FROM pg_class c
		WHERE c.relnamespace = 'pgquota'::regnamespace AND c.relkind IN ('r', 'p')
		  AND c.relreplident <> 'f'
		  AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
		                  AND (i.indisreplident OR (c.relreplident = 'd' AND i.indisprimary)))
		ORDER BY 1`)
}

// A cluster distributed by an older build (no replica identity on the
// row-type tables) that runs Up again gets 00026's REPLICA IDENTITY on the
// coordinator and on every worker's placements, so that a rebalance can
// move them (internal/cli/citus_rebalance_under_load_test.go).
func TestCitusUpgradeGivesEveryPlacementAReplicaIdentity(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ctx := context.Background()
	db := citusDB(t, c)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)

	// The cluster as the build before 00026 left it: the later migrations
	// rolled back (their Down on Citus).
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 25)
	require.NoError(t, err)
	workers := c.Workers()
	workerDB := func(i int) *sql.DB {
		w, err := sql.Open("pgx", workers[i].URL(cituscluster.Database))
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		return w
	}
	require.NotEmpty(t, withoutReplicaIdentity(t, workerDB(0)), "the older schema's placements lack one")

	res, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.NotEmpty(t, res)
	require.Empty(t, withoutReplicaIdentity(t, db), "coordinator")
	for i := range workers {
		require.Empty(t, withoutReplicaIdentity(t, workerDB(i)), "worker %d", workers[i].Port)
	}
}
