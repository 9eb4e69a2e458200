package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
)

func (a *app) migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, roll back or inspect pgquota's migrations (schema pgquota)",
		Long: `Apply, roll back or inspect pgquota's goose migrations. They live in the
pgquota schema, with goose's version table pgquota.pgquota_migrations (a
name no migration tool uses by default, so an application's own goose never
takes it for its own, even with pgquota on its search_path).

up and down run as the schema's owner and take the migration lock, a
session-level advisory lock: replicas that migrate at once wait for each
other and each migration runs once. Migrate on a direct connection or a
session-mode pooler. status and version only read: they take no lock and
answer while another process migrates. grant-app sets up an application
role (least privilege: no DDL).`,
	}
	var allowMissing bool
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration",
		Long: `Apply every pending migration. It refuses, applying nothing, a schema with
migrations this build does not know (migrated by a newer pgquota: upgrade
pgquota) or missing a migration below its newest one (a gap: --allow-missing
applies the missing ones out of order).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.refuseTransactionPooler("migrate up"); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, err := a.sqlDB(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			var opts []migrations.Option
			if allowMissing {
				opts = append(opts, migrations.AllowMissing())
			}
			res, err := migrations.Up(ctx, db, opts...)
			if err != nil {
				var se *migrations.SchemaError
				if errors.As(err, &se) {
					return fmt.Errorf("migrate up: %s: %w", a.target, err)
				}
				return fmt.Errorf("migrate up: %w", permissionHint(err))
			}
			if err := a.printResults(ctx, db, res); err != nil {
				return err
			}
			var hasRole bool
			if err := db.QueryRowContext(ctx, `SELECT to_regrole($1) IS NOT NULL`, migrations.AppRole).Scan(&hasRole); err == nil && !hasRole {
				fmt.Fprintf(a.stderr, "pgquota: warning: role %s does not exist and this role may not create it: no application role was granted pgquota's objects; as a role with CREATEROLE run CREATE ROLE %s NOLOGIN, then pgquota migrate grant-app\n",
					migrations.AppRole, migrations.AppRole)
			}
			return nil
		},
	}
	up.Flags().BoolVar(&allowMissing, "allow-missing", false, "apply migrations missing below the newest applied one (out of order) instead of failing")
	cmd.AddCommand(
		up,
		a.migrateDownCommand(),
		&cobra.Command{
			Use:   "status",
			Short: "List every migration and whether it is applied",
			Long: `List every migration and whether it is applied. It takes no lock and creates
nothing. It fails on a schema with migrations this build does not know, or
with a gap, naming them and the way out.

On Citus (the database has the citus extension) the text also lists how
each pgquota table is distributed: reference, distributed by a column
(colocated with a table), or local (on the coordinator only). --json prints
the list of migrations alone, on every server; ` + "`pgquota migrate tables --json`" + `
gives the distribution.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				ctx := cmd.Context()
				st, err := a.readState(ctx)
				if err != nil {
					return fmt.Errorf("migrate status: %w", err)
				}
				if err := st.Check(false); err != nil {
					return fmt.Errorf("migrate status: %s: %w", a.target, err)
				}
				type item struct {
					Version   int64      `json:"version"`
					File      string     `json:"file"`
					Applied   bool       `json:"applied"`
					AppliedAt *time.Time `json:"applied_at"`
				}
				var items []item
				names, err := fs.Glob(migrations.FS, "*.sql")
				if err != nil {
					return err
				}
				for _, name := range names {
					v, err := goose.NumericComponent(name)
					if err != nil {
						return err
					}
					it := item{Version: v, File: name}
					if at, ok := st.Applied[v]; ok {
						it.Applied, it.AppliedAt = true, &at
					}
					items = append(items, it)
				}
				text := func(w *tabwriter.Writer) {
					row(w, "VERSION", "FILE", "APPLIED")
					for _, it := range items {
						applied := "pending"
						if it.AppliedAt != nil {
							applied = stamp(*it.AppliedAt)
						}
						row(w, it.Version, it.File, applied)
					}
				}
				tables, err := a.readDistribution(ctx)
				if err != nil {
					return fmt.Errorf("migrate status: %w", err)
				}
				if tables == nil {
					return a.output(items, text)
				}
				return a.output(items, func(w *tabwriter.Writer) {
					text(w)
					row(w)
					row(w, "TABLE", "CITUS")
					for _, t := range tables {
						row(w, migrations.Schema+"."+t.Table, t.text)
					}
				})
			},
		},
		&cobra.Command{
			Use:   "tables",
			Short: "List how pgquota's tables are distributed on Citus",
			Long: `List how each pgquota table is distributed when the database is a Citus
coordinator (it has the citus extension; ` + "`migrate up`" + ` distributes them):
reference, distributed by a column (colocated with a table), or local (on
the coordinator only), with its shard count. On a server without Citus it
says so and lists nothing (--json: []). It takes no lock and creates
nothing.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				tables, err := a.readDistribution(cmd.Context())
				if err != nil {
					return fmt.Errorf("migrate tables: %w", err)
				}
				if tables == nil {
					tables = []citusTableOut{}
				}
				return a.output(tables, func(w *tabwriter.Writer) {
					if len(tables) == 0 {
						row(w, "no citus extension in this database: pgquota's tables are plain PostgreSQL tables")
						return
					}
					row(w, "TABLE", "CITUS", "SHARDS")
					for _, t := range tables {
						row(w, migrations.Schema+"."+t.Table, t.text, t.Shards)
					}
				})
			},
		},
		&cobra.Command{
			Use:   "version",
			Short: "Print the database's migration version and the one this build needs",
			Long: `Print the database's migration version (its newest applied migration) and
the one this build needs. It takes no lock and creates nothing.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				st, err := a.readState(cmd.Context())
				if err != nil {
					return fmt.Errorf("migrate version: %w", err)
				}
				out := struct {
					Database target `json:"connection"`
					Version  int64  `json:"version"`
					Latest   int64  `json:"latest"`
				}{*a.target, st.Current, migrations.Latest()}
				return a.output(out, func(w *tabwriter.Writer) {
					row(w, "database", out.Database.brief())
					row(w, "version", out.Version)
					row(w, "latest", out.Latest)
				})
			},
		},
		a.grantAppCommand(),
		a.grantRelayCommand(),
		a.grantOperatorCommand(),
	)
	return cmd
}

// refuseTransactionPooler fails migrate up and down, before they connect,
// when --pooler (else $PGQUOTA_POOLER) says a transaction-mode pooler is in
// front of PostgreSQL: the migration lock is a session-level advisory lock
// (goose's), which such a pooler does not keep on one server connection,
// so concurrent runs would not wait for each other (one of four concurrent
// runs through PgBouncer failed with 23505 on pg_proc) and a lock could be
// left behind on a pooled connection.
func (a *app) refuseTransactionPooler(command string) error {
	setting, source := a.pooler, "--pooler"
	if setting == "" {
		setting, source = os.Getenv(quota.EnvPooler), "$"+quota.EnvPooler
	}
	mode, err := quota.ParsePoolerMode(source, setting)
	if err != nil {
		return usageError{err}
	}
	if mode != quota.PoolerTransaction {
		return nil
	}
	return usagef("%s refuses %s=%s: migrations take a session-level advisory lock (goose's), which a transaction-mode pooler "+
		"does not keep; migrate on a direct connection to PostgreSQL or through a session-mode pooler, without %s", command, source, setting, source)
}

// sqlDB connects and returns a database/sql handle on the pool (for goose).
func (a *app) sqlDB(ctx context.Context) (*sql.DB, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	return stdlib.OpenDBFromPool(pool), nil
}

// readState reads the migration state without the migration lock.
func (a *app) readState(ctx context.Context) (migrations.State, error) {
	db, err := a.sqlDB(ctx)
	if err != nil {
		return migrations.State{}, err
	}
	defer db.Close()
	st, err := migrations.ReadState(ctx, db)
	if err != nil {
		return st, permissionHint(err)
	}
	return st, nil
}

// citusTableOut is one table of migrate status on Citus.
type citusTableOut struct {
	Table         string  `json:"table"`
	Method        string  `json:"method"`
	Column        *string `json:"column"`
	ColocatedWith *string `json:"colocated_with"`
	Shards        int     `json:"shards"`
	text          string
}

// readDistribution reads how pgquota's tables are distributed on Citus,
// nil when the database has no citus extension.
func (a *app) readDistribution(ctx context.Context) ([]citusTableOut, error) {
	db, err := a.sqlDB(ctx)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	dist, err := migrations.ReadDistribution(ctx, db)
	if err != nil || dist == nil {
		return nil, err
	}
	out := make([]citusTableOut, len(dist))
	for i, d := range dist {
		out[i] = citusTableOut{Table: d.Table, Method: d.Method, Shards: d.Shards, text: d.String()}
		if d.Column != "" {
			out[i].Column = &d.Column
		}
		if d.ColocatedWith != "" {
			out[i].ColocatedWith = &d.ColocatedWith
		}
	}
	return out, nil
}

// permissionHint adds to a permission error (SQLSTATE 42501) what to do.
func permissionHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("%w: migrate as the owner of schema %s (or a role that may create it); "+
			"an application role needs only the %s role (pgquota migrate grant-app --role ROLE)", err, migrations.Schema, migrations.AppRole)
	}
	return err
}

func (a *app) migrateDownCommand() *cobra.Command {
	var to int64
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Roll back the newest applied migration (or every one above --to)",
		Long: `Roll back the newest applied migration, or with --to N every migration above
version N (--to 0: all of them). At version 0 there is nothing to roll back:
it says so and exits 0. Rolling back drops the tables of the migrations it
undoes, with their data.

To remove pgquota from a database: pgquota migrate down --to 0, then
DROP SCHEMA pgquota CASCADE (which drops the version table
pgquota.pgquota_migrations too), and, once no database of the server uses
them (roles are the server's, not the database's),
DROP ROLE pgquota_operator, pgquota_relay, pgquota_app after revoking
them from the LOGIN roles they were granted to.

Rolling back below migration 6 (or 3, for a guard of the first form)
drops the fence guard's function: while an application table is guarded
it refuses before rolling anything back and names the DROP TRIGGER
statements that detach the guards.`,
		Example: `  pgquota migrate down
  pgquota migrate down --to 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.refuseTransactionPooler("migrate down"); err != nil {
				return err
			}
			byVersion := cmd.Flags().Changed("to")
			if byVersion && (to < 0 || to > migrations.Latest()) {
				return usagef("--to must be between 0 and %d, got %d", migrations.Latest(), to)
			}
			return a.withProvider(cmd.Context(), func(ctx context.Context, db *sql.DB, p *goose.Provider, installed bool) error {
				var current int64
				if installed {
					var err error
					if current, err = p.GetDBVersion(ctx); err != nil {
						return fmt.Errorf("migrate down: read version: %w", err)
					}
				}
				if current == 0 || (byVersion && current <= to) {
					out := struct {
						Connection target `json:"connection"`
						Applied    []any  `json:"applied"`
						Version    int64  `json:"version"`
						Latest     int64  `json:"latest"`
					}{*a.target, []any{}, current, migrations.Latest()}
					return a.output(out, func(w *tabwriter.Writer) {
						row(w, "database", out.Connection.brief())
						if current == 0 {
							row(w, "nothing to roll back (version 0)")
						} else {
							row(w, fmt.Sprintf("nothing to roll back (version %d, --to %d)", current, to))
						}
					})
				}
				target := current - 1
				if byVersion {
					target = to
				}
				if err := a.refuseDownPastGuards(ctx, target); err != nil {
					return err
				}
				var res []*goose.MigrationResult
				var err error
				if byVersion {
					res, err = p.DownTo(ctx, to)
				} else {
					var r *goose.MigrationResult
					r, err = p.Down(ctx)
					res = append(res, r)
				}
				if err != nil {
					return a.downFailed(ctx, db, err)
				}
				return a.printResults(ctx, db, res)
			})
		},
	}
	cmd.Flags().Int64Var(&to, "to", 0, "roll back every migration above this version (default: only the newest)")
	return cmd
}

// downFailed reports a rollback that stopped at a migration: the
// migrations rolled back before it (on stdout, as a successful run
// prints them), and the error, with what to do when the failing migration
// could not drop pgquota's fence guard function because application
// tables still use it (SQLSTATE 2BP01, dependent objects).
func (a *app) downFailed(ctx context.Context, db *sql.DB, err error) error {
	var partial *goose.PartialError
	if errors.As(err, &partial) && len(partial.Applied) > 0 {
		if perr := a.printResults(ctx, db, partial.Applied); perr != nil {
			return errors.Join(fmt.Errorf("migrate down: %w", err), perr)
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "2BP01" && strings.Contains(pgErr.Message, "fence_guard") {
		if tables := a.guardedTables(ctx); len(tables) > 0 {
			drops := make([]string, len(tables))
			for i, t := range tables {
				drops[i] = "DROP TRIGGER " + t.trigger + " ON " + t.table
			}
			return fmt.Errorf("migrate down: %w: application tables still use pgquota's fence guard (pgquota fence guard): %s; then run this again", err, strings.Join(drops, "; "))
		}
		return fmt.Errorf("migrate down: %w: application tables still use pgquota's fence guard (pgquota fence guard): drop those triggers, then run this again", err)
	}
	return fmt.Errorf("migrate down: %w", permissionHint(err))
}

type guardTrigger struct{ table, trigger, function string }

// guardFunctionVersion is the migration that creates each guard function:
// rolling back below it drops the function, on which the guard triggers of
// application tables depend (the rollback would fail with 2BP01 only
// after rolling back every migration above it).
var guardFunctionVersion = map[string]int64{"fence_guard": 3, "fence_guard_presented": 6}

// refuseDownPastGuards fails, before anything is rolled back, when rolling
// back to version target would drop a guard function that a trigger on an
// application table still calls, naming the DROP TRIGGER statements that
// detach them.
func (a *app) refuseDownPastGuards(ctx context.Context, target int64) error {
	var drops []string
	for _, t := range a.guardedTables(ctx) {
		if target < guardFunctionVersion[t.function] {
			drops = append(drops, "DROP TRIGGER "+t.trigger+" ON "+t.table)
		}
	}
	if len(drops) == 0 {
		return nil
	}
	return fmt.Errorf("migrate down: rolling back to version %d drops pgquota's fence guard, which application tables still use (pgquota fence guard); nothing was rolled back: "+
		"run %s; then run this again", target, strings.Join(drops, "; "))
}

// guardedTables lists the triggers that call pgquota's guard functions
// (pgquota.fence_guard of 00003_lease.sql, pgquota.fence_guard_presented of
// 00006_fence_guard.sql: for each guarded table its row trigger
// pgquota_fence_guard and its TRUNCATE trigger pgquota_fence_guard_truncate),
// with their tables, quoted for SQL; nil when they cannot be read.
func (a *app) guardedTables(ctx context.Context) []guardTrigger {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil
	}
	rows, err := pool.Query(ctx, `
		SELECT t.tgrelid::regclass::text, quote_ident(t.tgname), p.proname::text
		FROM pg_trigger t
		JOIN pg_proc p ON p.oid = t.tgfoid
		JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'pgquota' AND p.proname IN ('fence_guard', 'fence_guard_presented') AND NOT t.tgisinternal
		ORDER BY 1, 2`)
	if err != nil {
		return nil
	}
	var out []guardTrigger
	for rows.Next() {
		var g guardTrigger
		if rows.Scan(&g.table, &g.trigger, &g.function) != nil {
			return nil
		}
		out = append(out, g)
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}

// withProvider runs fn with a goose provider on the target database (for
// down): fn learns whether pgquota's migrations were ever run there; the
// provider's runs take the migration lock.
func (a *app) withProvider(ctx context.Context, fn func(ctx context.Context, db *sql.DB, p *goose.Provider, installed bool) error) error {
	db, err := a.sqlDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	st, err := migrations.ReadState(ctx, db)
	if err != nil {
		return fmt.Errorf("connect: %w", permissionHint(err))
	}
	// A schema a newer build migrated: goose would look for a migration
	// file it does not have ("version not found"). Name it as up and
	// status do (ErrSchemaNewer), and roll back nothing.
	if err := st.Check(true); err != nil {
		return fmt.Errorf("migrate down: %s: %w", a.target, err)
	}
	p, err := migrations.NewProvider(db)
	if err != nil {
		return err
	}
	return fn(ctx, db, p, st.Installed)
}

func (a *app) printResults(ctx context.Context, db *sql.DB, res []*goose.MigrationResult) error {
	type item struct {
		Version    int64  `json:"version"`
		File       string `json:"file"`
		Direction  string `json:"direction"`
		DurationMS int64  `json:"duration_ms"`
		took       time.Duration
	}
	items := make([]item, 0, len(res))
	for _, r := range res {
		if r == nil {
			continue
		}
		items = append(items, item{Version: r.Source.Version, File: r.Source.Path, Direction: r.Direction, DurationMS: r.Duration.Milliseconds(), took: r.Duration})
	}
	st, err := migrations.ReadState(ctx, db)
	if err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	current := st.Current
	// On a Citus coordinator, how many of pgquota's tables Citus knows
	// (distributed or reference), so that the run says it distributed
	// them; `migrate status` and `migrate tables` list how.
	// ReadDistribution is empty without the citus extension.
	var citus *int
	dist, err := migrations.ReadDistribution(ctx, db)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if len(dist) > 0 {
		n := 0
		for _, d := range dist {
			if d.Method != migrations.Local {
				n++
			}
		}
		citus = &n
	}
	out := struct {
		Database target `json:"connection"`
		Applied  []item `json:"applied"`
		Version  int64  `json:"version"`
		Latest   int64  `json:"latest"`
		// CitusTables is set on a Citus coordinator: the number of
		// pgquota's tables that are distributed or reference tables.
		CitusTables *int `json:"citus_tables,omitempty"`
	}{*a.target, items, current, migrations.Latest(), citus}
	return a.output(out, func(w *tabwriter.Writer) {
		row(w, "database", out.Database.brief())
		if len(items) == 0 {
			row(w, "no migrations to apply")
		}
		for _, it := range items {
			row(w, it.Direction, it.File, strconv.FormatFloat(it.took.Seconds(), 'f', 3, 64)+"s")
		}
		row(w, "version", fmt.Sprintf("%d (this build needs %d)", current, out.Latest))
		if citus != nil {
			row(w, "citus", fmt.Sprintf("%d tables distributed or reference, the rest on the coordinator (pgquota migrate tables lists them)", *citus))
		}
	})
}
