package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/migrations"
)

// grantAppCommand is `pgquota migrate grant-app`: the documented way to set
// up an application role.
func (a *app) grantAppCommand() *cobra.Command {
	var role string
	cmd := &cobra.Command{
		Use:   "grant-app",
		Short: "Grant an application role what pgquota's calls need (least privilege, no DDL)",
		Long: `Set up least privilege for an application. Run it as the owner of schema
pgquota, after pgquota migrate up. It creates the NOLOGIN group role
pgquota_app when it is missing (roles are cluster-wide; creating one needs
CREATEROLE), grants it USAGE on the schema, SELECT, INSERT, UPDATE and DELETE
on every table and view, USAGE and SELECT on the sequences, EXECUTE on the
functions and SELECT on the version table, with default privileges so that
objects of later migrations are granted as they are created, and with
--role makes ROLE (the role the application logs in as) a member.

Migrations do the same for pgquota_app on their own; run this to add a
member, after creating pgquota_app by hand, or after migrating as another
owner. The application then makes every pgquota call, but no DDL: it
neither migrates nor attaches fence guards (run those as the owner).`,
		Example: `  pgquota migrate grant-app --role app
  psql -c 'CREATE ROLE app LOGIN' && pgquota migrate grant-app --role app`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			created, err := grantApp(ctx, pool.Begin, role)
			if err != nil {
				return fmt.Errorf("migrate grant-app: %w", err)
			}
			out := struct {
				Connection target `json:"connection"`
				AppRole    string `json:"app_role"`
				Created    bool   `json:"created"`
				Member     string `json:"member"`
			}{*a.target, migrations.AppRole, created, role}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "database", out.Connection.brief())
				if created {
					row(w, "created role", migrations.AppRole)
				}
				row(w, "granted", migrations.AppRole+" on schema "+migrations.Schema)
				if role != "" {
					row(w, "member", role+" of "+migrations.AppRole)
				}
			})
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "make this existing role (the application's login role) a member of "+migrations.AppRole)
	return cmd
}

// grantApp runs grant-app in one transaction that holds the migration lock
// (transaction-level, so concurrent grants and migrations of this database
// never update the same privileges at once). It reports whether it created
// migrations.AppRole.
func grantApp(ctx context.Context, begin func(context.Context) (pgx.Tx, error), role string) (created bool, err error) {
	tx, err := begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('pgquota.migrate', 0))`); err != nil {
		return false, err
	}
	var hasFunc, hasRole, hasMember bool
	if err := tx.QueryRow(ctx, `
		SELECT to_regprocedure('pgquota.grant_app(name)') IS NOT NULL, to_regrole($1) IS NOT NULL,
		       $2 = '' OR to_regrole($2) IS NOT NULL`, migrations.AppRole, role).Scan(&hasFunc, &hasRole, &hasMember); err != nil {
		return false, err
	}
	if !hasFunc {
		return false, errors.New("schema pgquota has no pgquota.grant_app (migration 00010): run pgquota migrate up first")
	}
	if !hasMember {
		return false, fmt.Errorf("role %q does not exist: create it first (CREATE ROLE %s LOGIN)", role, pgx.Identifier{role}.Sanitize())
	}
	if !hasRole {
		if _, err := tx.Exec(ctx, `CREATE ROLE `+migrations.AppRole+` NOLOGIN`); err != nil {
			if isInsufficientPrivilege(err) {
				return false, fmt.Errorf("%w: this role may not create roles: as a role with CREATEROLE run CREATE ROLE %s NOLOGIN, then run this again", err, migrations.AppRole)
			}
			return false, err
		}
		created = true
	}
	if _, err := tx.Exec(ctx, `SELECT pgquota.grant_app($1)`, migrations.AppRole); err != nil {
		if isInsufficientPrivilege(err) {
			return false, fmt.Errorf("%w: run this as the owner of schema %s (the role that migrated it)", err, migrations.Schema)
		}
		return false, err
	}
	if role != "" {
		if _, err := tx.Exec(ctx, `GRANT `+migrations.AppRole+` TO `+pgx.Identifier{role}.Sanitize()); err != nil {
			if isInsufficientPrivilege(err) {
				return false, fmt.Errorf("%w: granting membership in %s needs CREATEROLE or its ADMIN OPTION: as such a role run GRANT %s TO %s",
					err, migrations.AppRole, migrations.AppRole, pgx.Identifier{role}.Sanitize())
			}
			return false, err
		}
	}
	return created, tx.Commit(ctx)
}

func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
