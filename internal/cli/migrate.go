package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/migrations"
)

func (a *app) migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, roll back or inspect pgquota's migrations (schema pgquota)",
		Long: `Apply, roll back or inspect pgquota's goose migrations. They live in the
pgquota schema, with goose's version table pgquota.goose_db_version, so an
application that also uses goose never collides with them. Replicas that
migrate at once wait for each other's lock; each migration runs once.`,
	}
	cmd.AddCommand(
		&cobra.Command{
			Use:   "up",
			Short: "Apply every pending migration",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return a.withProvider(cmd.Context(), true, func(ctx context.Context, p *goose.Provider, _ bool) error {
					res, err := p.Up(ctx)
					if err != nil {
						return fmt.Errorf("migrate up: %w", err)
					}
					return a.printResults(ctx, p, res)
				})
			},
		},
		a.migrateDownCommand(),
		&cobra.Command{
			Use:   "status",
			Short: "List every migration and whether it is applied",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return a.withProvider(cmd.Context(), false, func(ctx context.Context, p *goose.Provider, installed bool) error {
					var st []*goose.MigrationStatus
					if installed {
						var err error
						if st, err = p.Status(ctx); err != nil {
							return fmt.Errorf("migrate status: %w", err)
						}
					} else {
						for _, src := range p.ListSources() {
							st = append(st, &goose.MigrationStatus{Source: src, State: goose.StatePending})
						}
					}
					type item struct {
						Version   int64      `json:"version"`
						File      string     `json:"file"`
						Applied   bool       `json:"applied"`
						AppliedAt *time.Time `json:"applied_at,omitempty"`
					}
					items := make([]item, len(st))
					for i, s := range st {
						items[i] = item{Version: s.Source.Version, File: s.Source.Path, Applied: s.State == goose.StateApplied}
						if items[i].Applied {
							at := s.AppliedAt
							items[i].AppliedAt = &at
						}
					}
					return a.output(items, func(w *tabwriter.Writer) {
						row(w, "VERSION", "FILE", "APPLIED")
						for _, it := range items {
							applied := "pending"
							if it.AppliedAt != nil {
								applied = stamp(*it.AppliedAt)
							}
							row(w, it.Version, it.File, applied)
						}
					})
				})
			},
		},
		&cobra.Command{
			Use:   "version",
			Short: "Print the database's migration version and the one this build needs",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return a.withProvider(cmd.Context(), false, func(ctx context.Context, p *goose.Provider, installed bool) error {
					return a.printVersion(ctx, p, installed)
				})
			},
		},
	)
	return cmd
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
DROP SCHEMA pgquota CASCADE (which drops goose's pgquota.goose_db_version
and pgquota.goose_lock tables too).`,
		Example: `  pgquota migrate down
  pgquota migrate down --to 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			byVersion := cmd.Flags().Changed("to")
			if byVersion && (to < 0 || to > migrations.Latest()) {
				return usagef("--to must be between 0 and %d, got %d", migrations.Latest(), to)
			}
			return a.withProvider(cmd.Context(), false, func(ctx context.Context, p *goose.Provider, installed bool) error {
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
					return a.downFailed(ctx, p, err)
				}
				return a.printResults(ctx, p, res)
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
func (a *app) downFailed(ctx context.Context, p *goose.Provider, err error) error {
	var partial *goose.PartialError
	if errors.As(err, &partial) && len(partial.Applied) > 0 {
		if perr := a.printResults(ctx, p, partial.Applied); perr != nil {
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
	return fmt.Errorf("migrate down: %w", err)
}

type guardTrigger struct{ table, trigger string }

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
		SELECT t.tgrelid::regclass::text, quote_ident(t.tgname)
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
		if rows.Scan(&g.table, &g.trigger) != nil {
			return nil
		}
		out = append(out, g)
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}

// withProvider runs fn with a goose provider on the target database.
// goose keeps its version table in the pgquota schema and creates that
// table on first use, even to read the version, so with create the schema
// is created first; without it (status, version) nothing is created, and
// fn learns whether pgquota's migrations were ever run there.
func (a *app) withProvider(ctx context.Context, create bool, fn func(ctx context.Context, p *goose.Provider, installed bool) error) error {
	pool, err := a.connect(ctx)
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	var installed bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&installed); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if create && !installed {
		if err := migrations.EnsureSchema(ctx, db); err != nil {
			return err
		}
		installed = true
	}
	p, err := migrations.NewProvider(db)
	if err != nil {
		return err
	}
	return fn(ctx, p, installed)
}

func (a *app) printResults(ctx context.Context, p *goose.Provider, res []*goose.MigrationResult) error {
	type item struct {
		Version   int64   `json:"version"`
		File      string  `json:"file"`
		Direction string  `json:"direction"`
		Seconds   float64 `json:"seconds"`
	}
	items := make([]item, 0, len(res))
	for _, r := range res {
		if r == nil {
			continue
		}
		items = append(items, item{Version: r.Source.Version, File: r.Source.Path, Direction: r.Direction, Seconds: r.Duration.Seconds()})
	}
	current, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	out := struct {
		Database target `json:"connection"`
		Applied  []item `json:"applied"`
		Version  int64  `json:"version"`
		Latest   int64  `json:"latest"`
	}{*a.target, items, current, migrations.Latest()}
	return a.output(out, func(w *tabwriter.Writer) {
		row(w, "database", out.Database.brief())
		if len(items) == 0 {
			row(w, "no migrations to apply")
		}
		for _, it := range items {
			row(w, it.Direction, it.File, strconv.FormatFloat(it.Seconds, 'f', 3, 64)+"s")
		}
		row(w, "version", fmt.Sprintf("%d (this build needs %d)", current, out.Latest))
	})
}

func (a *app) printVersion(ctx context.Context, p *goose.Provider, installed bool) error {
	var current int64
	if installed {
		var err error
		if current, err = p.GetDBVersion(ctx); err != nil {
			return fmt.Errorf("migrate version: %w", err)
		}
	}
	out := struct {
		Database target `json:"connection"`
		Version  int64  `json:"version"`
		Latest   int64  `json:"latest"`
	}{*a.target, current, migrations.Latest()}
	return a.output(out, func(w *tabwriter.Writer) {
		row(w, "database", out.Database.brief())
		row(w, "version", current)
		row(w, "latest", out.Latest)
	})
}
