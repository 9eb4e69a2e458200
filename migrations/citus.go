package migrations

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Distribution methods of a table on Citus (citus_tables.citus_table_type,
// with "local" also for a table Citus does not know).
const (
	// Reference: a copy of the table on every node.
	Reference = "reference"
	// Distributed: hash-distributed by a column, in shards over the
	// workers.
	Distributed = "distributed"
	// Local: on the coordinator only.
	Local = "local"
)

// citusTable is how one pgquota table is distributed on Citus.
type citusTable struct {
	table  string // in Schema
	method string // Reference, Distributed or Local
	column string // the distribution column (Distributed)
	// colocate is the table whose shards this one's are colocated with
	// (Distributed): "" starts a colocation group of its own.
	colocate string
	// unsafeTriggers: the table has triggers (lease: the slot triggers
	// of 00012), which Citus refuses on a distributed table unless
	// citus.enable_unsafe_triggers is on.
	unsafeTriggers bool
}

// citusPlan lists every table of schema pgquota and how it is distributed
// when the database has the citus extension, in the order it is done:
// a table before the tables that reference it (a reference table before a
// table with a foreign key to it, a colocation group's first table before
// the others). A migration that creates a table must add it here: Up fails
// naming a pgquota table that is not in the plan.
//
// Citus refuses to distribute ledger (by scope, idempotency key or grant
// id: UNIQUE constraints without the distribution column), hence
// ledger_outcome (a foreign key to ledger): both are reference tables.
// The outbox stays a plain table on the coordinator: the relay's claim
// (FOR UPDATE SKIP LOCKED over the oldest pending events) is a scan across
// shards, which Citus refuses.
var citusPlan = []citusTable{
	{table: "pgquota_migrations", method: Local}, // goose's version table
	{table: "quota", method: Reference},
	{table: "quota_override", method: Reference},
	{table: "quota_shape", method: Reference},
	{table: "quota_shape_defined", method: Reference},
	{table: "lease_epoch", method: Reference},
	{table: "fence_guard_resource", method: Reference},
	{table: "fence_secret", method: Reference},
	{table: "function_grant", method: Reference},
	{table: "ledger", method: Reference},
	{table: "ledger_outcome", method: Reference},
	{table: "usage", method: Distributed, column: "member"},
	{table: "rolling_usage", method: Distributed, column: "member", colocate: "usage"},
	{table: "rate_state", method: Distributed, column: "member", colocate: "usage"},
	{table: "counter_lock", method: Distributed, column: "member", colocate: "usage"},
	{table: "lease", method: Distributed, column: "name", unsafeTriggers: true},
	{table: "fence", method: Distributed, column: "resource", colocate: "lease"},
	{table: "fenced_row", method: Distributed, column: "resource", colocate: "lease"},
	{table: "lease_waiter", method: Distributed, column: "name", colocate: "lease"},
	{table: "semaphore", method: Distributed, column: "name", colocate: "lease"},
	{table: "voucher_pool", method: Distributed, column: "campaign"},
	{table: "voucher_claim", method: Distributed, column: "campaign", colocate: "voucher_pool"},
	{table: "voucher_code", method: Distributed, column: "campaign", colocate: "voucher_pool"},
	{table: "voucher_shard", method: Distributed, column: "campaign", colocate: "voucher_pool"},
	{table: "outbox", method: Local},
	{table: "outbox_claimed", method: Local},
}

// UnplannedTableError is Up's error on Citus when schema pgquota has a
// table that citusPlan (migrations/citus.go) does not say how to
// distribute: the migrations are applied, the tables are not distributed.
type UnplannedTableError struct {
	// Tables are the tables not in the plan, without the schema.
	Tables []string
}

func (e *UnplannedTableError) Error() string {
	names := make([]string, len(e.Tables))
	for i, t := range e.Tables {
		names[i] = Schema + "." + t
	}
	return fmt.Sprintf("pgquota: distribute on Citus: table %s is not in pgquota's Citus plan (citusPlan in migrations/citus.go): "+
		"the migrations are applied but this run distributed no table; the migration that created it must say there how it is "+
		"distributed (reference, distributed by a column colocated with a table, or local)", strings.Join(names, ", "))
}

// TableDistribution is how a table of schema pgquota is distributed on
// Citus, as the coordinator's metadata says.
type TableDistribution struct {
	// Table is the table's name, without the schema.
	Table string
	// Method is Reference, Distributed or Local (also for a table Citus
	// does not know).
	Method string
	// Column is the distribution column of a Distributed table, else "".
	Column string
	// ColocatedWith is the table a Distributed table is colocated with:
	// the one named in the plan when the two share their colocation
	// group, else the group's oldest other table; "" for a group's first
	// table (or one alone in its group).
	ColocatedWith string
	// Shards is the number of shards of a Distributed table (one for a
	// reference or Citus-local table, 0 for a table Citus does not know).
	Shards int
}

// String is the table's distribution in words: "reference", "distributed
// by member colocated with usage", "local".
func (d TableDistribution) String() string {
	switch {
	case d.Method != Distributed:
		return d.Method
	case d.ColocatedWith != "":
		return fmt.Sprintf("distributed by %s colocated with %s", d.Column, d.ColocatedWith)
	default:
		return "distributed by " + d.Column
	}
}

// ErrCitusWorker is the error on a Citus worker node's database, wrapped
// by *CitusWorkerError: pgquota runs on the coordinator only. Its version
// table, its token sequence (lease tokens, so their order) and the
// advisory locks that order lease acquisitions and waiters are the
// coordinator's, and every decision reads the coordinator's clock; a
// worker has none of them, so Up, ReadState (and so Client.CheckSchema
// and every pgquota command) refuse it, and a lease call sent there fails.
var ErrCitusWorker = errors.New("pgquota: this is a Citus worker node: pgquota runs on the coordinator only")

// SQLStateCitusWorker is the SQLSTATE of the lease calls (lease_acquire,
// lease_release, slot_acquire) run on a Citus worker node: the Go library
// returns it wrapped with ErrCitusWorker.
const SQLStateCitusWorker = "PQ021"

// CitusWorkerError is ErrCitusWorker with the coordinator's address as
// the worker's pg_dist_node lists it.
type CitusWorkerError struct {
	// Coordinator is the coordinator's host:port, "" when the worker's
	// metadata does not list it.
	Coordinator string
}

func (e *CitusWorkerError) Error() string {
	if e.Coordinator == "" {
		return ErrCitusWorker.Error() + ": connect to the coordinator"
	}
	return ErrCitusWorker.Error() + ": connect to the coordinator, " + e.Coordinator
}

func (e *CitusWorkerError) Unwrap() error { return ErrCitusWorker }

// CheckNotCitusWorker returns *CitusWorkerError (ErrCitusWorker) when db
// is a database on a Citus worker node (the citus extension, and
// citus_is_coordinator() false), nil on a coordinator or a server without
// Citus.
func CheckNotCitusWorker(ctx context.Context, db DBTX) error {
	has, err := HasCitus(ctx, db)
	if err != nil || !has {
		return err
	}
	rows, err := db.QueryContext(ctx, `SELECT citus_is_coordinator(),
		coalesce((SELECT nodename || ':' || nodeport FROM pg_dist_node
		          WHERE groupid = 0 AND noderole = 'primary' ORDER BY nodeid LIMIT 1), '')`)
	if err != nil {
		return errorf("pgquota: ask Citus whether this is the coordinator: %w", err)
	}
	defer rows.Close()
	coordinator, addr := true, ""
	for rows.Next() {
		if err := rows.Scan(&coordinator, &addr); err != nil {
			return errorf("pgquota: ask Citus whether this is the coordinator: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return errorf("pgquota: ask Citus whether this is the coordinator: %w", err)
	}
	if coordinator {
		return nil
	}
	return &CitusWorkerError{Coordinator: addr}
}

// HasCitus reports whether the database has the citus extension (one
// catalog query, pg_extension).
func HasCitus(ctx context.Context, db DBTX) (bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`)
	if err != nil {
		return false, errorf("pgquota: look for the citus extension: %w", err)
	}
	defer rows.Close()
	var has bool
	for rows.Next() {
		if err := rows.Scan(&has); err != nil {
			return false, errorf("pgquota: look for the citus extension: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return false, errorf("pgquota: look for the citus extension: %w", err)
	}
	return has, nil
}

// ReadDistribution returns how every table of schema pgquota is
// distributed, by table name, when the database has the citus extension;
// nil without it (after one catalog query). It reads the metadata only
// (citus_tables is not read: it sums shard sizes over the workers).
func ReadDistribution(ctx context.Context, db DBTX) ([]TableDistribution, error) {
	has, err := HasCitus(ctx, db)
	if err != nil || !has {
		return nil, err
	}
	return readDistribution(ctx, db)
}

func readDistribution(ctx context.Context, db DBTX) ([]TableDistribution, error) {
	// pg_dist_partition: partmethod 'h' with a distribution key is hash
	// distributed; 'n' is a reference table (repmodel 't') or a Citus
	// local one ('s'). The coordinator's placements of reference and
	// Citus-local tables are shards in the same schema (quota_102008):
	// relation_is_a_known_shard leaves them out. It takes no lock.
	rows, err := db.QueryContext(ctx, `
		SELECT c.relname::text,
		       CASE WHEN p.logicalrelid IS NULL THEN 'local'
		            WHEN p.partmethod = 'h' THEN 'distributed'
		            WHEN p.repmodel = 't' THEN 'reference'
		            ELSE 'local' END,
		       CASE WHEN p.partmethod = 'h' THEN coalesce(column_to_column_name(p.logicalrelid, p.partkey), '') ELSE '' END,
		       coalesce(p.colocationid, 0),
		       (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = c.oid)::int,
		       c.oid::bigint
		FROM pg_class c
		LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid
		WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
		  AND NOT relation_is_a_known_shard(c.oid)
		ORDER BY c.relname`, Schema)
	if err != nil {
		return nil, errorf("pgquota: read the Citus distribution: %w", err)
	}
	defer rows.Close()
	type entry struct {
		d          TableDistribution
		colocation int64
		oid        int64
	}
	var all []entry
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.d.Table, &e.d.Method, &e.d.Column, &e.colocation, &e.d.Shards, &e.oid); err != nil {
			return nil, errorf("pgquota: read the Citus distribution: %w", err)
		}
		all = append(all, e)
	}
	if err := rows.Err(); err != nil {
		return nil, errorf("pgquota: read the Citus distribution: %w", err)
	}
	planned := map[string]string{}
	for _, t := range citusPlan {
		planned[t.table] = t.colocate
	}
	out := make([]TableDistribution, len(all))
	for i, e := range all {
		d := e.d
		if d.Method == Distributed {
			var oldest *entry
			for j := range all {
				o := &all[j]
				if j == i || o.d.Method != Distributed || o.colocation != e.colocation {
					continue
				}
				if o.d.Table == planned[d.Table] {
					oldest = o
					break
				}
				if o.oid < e.oid && (oldest == nil || o.oid < oldest.oid) {
					oldest = o
				}
			}
			if oldest != nil {
				d.ColocatedWith = oldest.d.Table
			}
		}
		out[i] = d
	}
	return out, nil
}

// distributeCitus distributes schema pgquota's tables as citusPlan says
// when the database has the citus extension; without it, it does nothing
// after one catalog query. Up runs it after goose.
//
// A table Citus knows already (pg_dist_partition: reference, distributed
// or Citus local) is left as it is, so a later run (after a new migration,
// on a grown cluster) distributes only the new tables. A table not in the
// plan fails the run, naming it, before anything is distributed.
//
// It runs in one transaction on the coordinator, under the migration lock
// taken at transaction level: Citus creates the shards and their metadata
// on the workers in the same distributed transaction (two-phase commit),
// so an error leaves every table as it was. The rows of a table that has
// some are copied into its shards in that transaction.
func distributeCitus(ctx context.Context, db *sql.DB) error {
	has, err := HasCitus(ctx, db)
	if err != nil || !has {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return errorf("pgquota: distribute on Citus: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// Sequential mode: a transaction that has created a reference table
	// may not then open parallel connections to the same worker for the
	// shards of a table with a foreign key to it.
	for _, stmt := range []string{
		`SELECT pg_advisory_xact_lock(` + lockKey + `)`,
		`SET LOCAL citus.multi_shard_modify_mode = 'sequential'`,
	} {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return errorf("pgquota: distribute on Citus: %s: %w", stmt, err)
		}
	}
	current, err := readDistribution(ctx, tx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var unplanned []string
	inPlan := map[string]bool{}
	for _, t := range citusPlan {
		inPlan[t.table] = true
	}
	for _, d := range current {
		if !inPlan[d.Table] {
			unplanned = append(unplanned, d.Table)
		}
		// Citus knows the table when it has shards. A Citus-local one
		// (Citus converts a table with a foreign key to a reference table
		// into one) is turned into what the plan says.
		known[d.Table] = d.Shards > 0 && d.Method != Local
	}
	if len(unplanned) > 0 {
		return &UnplannedTableError{Tables: unplanned}
	}
	exists := map[string]bool{}
	for _, d := range current {
		exists[d.Table] = true
	}
	var todo []citusTable
	for _, t := range citusPlan {
		if exists[t.table] && !known[t.table] && t.method != Local {
			todo = append(todo, t)
		}
	}
	if len(todo) == 0 {
		if err := applyCitusCalls(ctx, tx); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return errorf("pgquota: distribute on Citus: commit the calls' Citus bodies: %w", err)
		}
		return nil
	}
	// The foreign keys from or to a table distributed here are dropped
	// first and added back at the end: Citus turns a plain table with a
	// foreign key to a new reference table (quota_override to quota) into
	// a Citus-local table by renaming the table itself into its shard, so
	// the row types that functions return move to the shard.
	fks, err := foreignKeys(ctx, tx, todo)
	if err != nil {
		return err
	}
	for _, fk := range fks {
		stmt := fmt.Sprintf(`ALTER TABLE %s.%s DROP CONSTRAINT %s`, Schema, quoteIdent(fk.table), quoteIdent(fk.name))
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return errorf("pgquota: distribute on Citus: %s: %w", stmt, err)
		}
	}
	var done []string
	for _, t := range todo {
		name := Schema + "." + t.table
		var stmts []string
		if t.unsafeTriggers {
			stmts = append(stmts, `SET LOCAL citus.enable_unsafe_triggers = on`)
		}
		switch t.method {
		case Reference:
			stmts = append(stmts, fmt.Sprintf(`SELECT create_reference_table('%s')`, name))
		case Distributed:
			colocate := "none"
			if t.colocate != "" {
				colocate = Schema + "." + t.colocate
			}
			stmts = append(stmts, fmt.Sprintf(`SELECT create_distributed_table('%s', '%s', colocate_with => '%s')`, name, t.column, colocate))
		}
		if t.unsafeTriggers {
			stmts = append(stmts, `SET LOCAL citus.enable_unsafe_triggers = off`)
		}
		for _, stmt := range stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return errorf("pgquota: distribute on Citus: %s: %w", stmt, err)
			}
		}
		done = append(done, t.table)
	}
	for _, fk := range fks {
		stmt := fmt.Sprintf(`ALTER TABLE %s.%s ADD CONSTRAINT %s %s`, Schema, quoteIdent(fk.table), quoteIdent(fk.name), fk.def)
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return errorf("pgquota: distribute on Citus: %s: %w", stmt, err)
		}
	}
	if err := checkShardTypes(ctx, tx); err != nil {
		return err
	}
	if err := applyCitusCalls(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return errorf("pgquota: distribute on Citus (%s): commit: %w", strings.Join(done, ", "), err)
	}
	return nil
}

// checkShardTypes fails when a pgquota function returns, or takes, the row
// type of a shard: Citus turning a table into a Citus-local one renames
// the table itself into its shard (quota_override_102009), and the row
// types of functions declared on it move along.
func checkShardTypes(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `
		SELECT DISTINCT p.oid::regprocedure::text, t.typrelid::regclass::text
		FROM pg_proc p
		JOIN pg_type t ON t.oid = p.prorettype OR t.oid = ANY (p.proargtypes::oid[]) OR t.oid = ANY (coalesce(p.proallargtypes, '{}'))
		WHERE p.pronamespace = $1::regnamespace AND t.typrelid <> 0 AND relation_is_a_known_shard(t.typrelid)
		ORDER BY 1`, Schema)
	if err != nil {
		return errorf("pgquota: distribute on Citus: check function types: %w", err)
	}
	defer rows.Close()
	var bad []string
	for rows.Next() {
		var fn, rel string
		if err := rows.Scan(&fn, &rel); err != nil {
			return errorf("pgquota: distribute on Citus: check function types: %w", err)
		}
		bad = append(bad, fn+" uses the row type of shard "+rel)
	}
	if err := rows.Err(); err != nil {
		return errorf("pgquota: distribute on Citus: check function types: %w", err)
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("pgquota: distribute on Citus: %s (nothing was distributed)", strings.Join(bad, "; "))
	}
	return nil
}

type foreignKey struct{ table, name, def string }

// foreignKeys returns the foreign keys of schema pgquota from or to one of
// tables, with their definitions (pg_get_constraintdef), in the order
// they were created.
func foreignKeys(ctx context.Context, tx *sql.Tx, tables []citusTable) ([]foreignKey, error) {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.table
	}
	rows, err := tx.QueryContext(ctx, `
		SELECT r.relname::text, c.conname::text, pg_get_constraintdef(c.oid)
		FROM pg_constraint c
		JOIN pg_class r ON r.oid = c.conrelid
		JOIN pg_class f ON f.oid = c.confrelid
		WHERE c.contype = 'f' AND c.connamespace = $1::regnamespace AND c.conparentid = 0
		  AND (r.relname::text = ANY ($2::text[]) OR f.relname::text = ANY ($2::text[]))
		ORDER BY c.oid`, Schema, "{"+strings.Join(names, ",")+"}")
	if err != nil {
		return nil, errorf("pgquota: distribute on Citus: read foreign keys: %w", err)
	}
	defer rows.Close()
	var out []foreignKey
	for rows.Next() {
		var fk foreignKey
		if err := rows.Scan(&fk.table, &fk.name, &fk.def); err != nil {
			return nil, errorf("pgquota: distribute on Citus: read foreign keys: %w", err)
		}
		out = append(out, fk)
	}
	if err := rows.Err(); err != nil {
		return nil, errorf("pgquota: distribute on Citus: read foreign keys: %w", err)
	}
	return out, nil
}

// quoteIdent quotes an SQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// citusCalls holds the Citus bodies of the calls whose plain versions
// Citus refuses (the clock in a modification's clauses): lease acquire,
// renew and release. See the file's head.
//
//go:embed citus/calls.sql
var citusCalls string

// applyCitusCalls replaces, in tx, the calls that have a Citus body
// (citus/calls.sql) with it: on every Up on a Citus coordinator, after the
// migrations, so a migration that redefines one of them is followed by its
// Citus body again. CREATE OR REPLACE keeps the functions' privileges.
//
// A Citus body must replace a function the migrations made: one whose
// arguments no longer match would add an overload beside it, which the
// count of pgquota's functions before and after catches (the run fails).
func applyCitusCalls(ctx context.Context, tx *sql.Tx) error {
	count := func() (int, error) {
		var n int
		err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace`, Schema).Scan(&n)
		return n, err
	}
	before, err := count()
	if err != nil {
		return errorf("pgquota: distribute on Citus: count pgquota's functions: %w", err)
	}
	if _, err := tx.ExecContext(ctx, citusCalls); err != nil {
		return errorf("pgquota: distribute on Citus: apply the calls' Citus bodies (migrations/citus/calls.sql): %w", err)
	}
	after, err := count()
	if err != nil {
		return errorf("pgquota: distribute on Citus: count pgquota's functions: %w", err)
	}
	if after != before {
		return fmt.Errorf("pgquota: distribute on Citus: migrations/citus/calls.sql created %d function(s) instead of replacing the migrations' own: "+
			"a Citus body's arguments differ from its function's (nothing was changed)", after-before)
	}
	return nil
}
