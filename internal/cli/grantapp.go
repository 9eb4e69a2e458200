package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/migrations"
)

// grantAppCommand is `pgquota migrate grant-app`: the documented way to set
// up an application role.
func (a *app) grantAppCommand() *cobra.Command {
	return a.grantRoleCommand("grant-app", migrations.AppRole,
		"Grant an application role pgquota's API (least privilege: no table writes, no DDL)",
		`Set up least privilege for an application. Run it as the owner of schema
pgquota, after pgquota migrate up. It creates the NOLOGIN group role
pgquota_app when it is missing (roles are cluster-wide; creating one needs
CREATEROLE), applies pgquota's privilege model (migration 00022: USAGE on the
schema, SELECT on its tables, EXECUTE on the API's SECURITY DEFINER
functions only; no INSERT, UPDATE, DELETE or TRUNCATE on any table, no
sequence, no internal function), and with --role makes ROLE (the role the
application logs in as) a member.

The application then makes every API call (grants, claims, usage, leases,
fenced writes, elections, semaphores, outbox enqueue, reads), but defines
nothing: quotas, campaigns, limits, code imports, lease epochs, fence guards
and reaping are the operator's (pgquota migrate grant-operator), the outbox
relay is the relay's (pgquota migrate grant-relay).`,
		`  pgquota migrate grant-app --role app
  psql -c 'CREATE ROLE app LOGIN' && pgquota migrate grant-app --role app`)
}

// grantRelayCommand is `pgquota migrate grant-relay`.
func (a *app) grantRelayCommand() *cobra.Command {
	return a.grantRoleCommand("grant-relay", migrations.RelayRole,
		"Grant a role the outbox relay's calls (claim, mark delivered or failed, reap)",
		`Make ROLE a member of pgquota_relay, the NOLOGIN group role of the outbox
relay: it claims events, marks them delivered or failed and reaps finished
ones, and reads pgquota's tables; nothing else. Run it as the owner of schema
pgquota after pgquota migrate up; it creates pgquota_relay when it is missing
(that needs CREATEROLE).`,
		`  pgquota migrate grant-relay --role relay`)
}

// grantOperatorCommand is `pgquota migrate grant-operator`.
func (a *app) grantOperatorCommand() *cobra.Command {
	return a.grantRoleCommand("grant-operator", migrations.OperatorRole,
		"Grant a role the operator's calls (define quotas and campaigns, set limits, import codes, bump epochs, guard, reap)",
		`Make ROLE a member of pgquota_operator, the NOLOGIN group role that defines
quotas and campaigns, sets limits and overrides, imports codes, bumps the
lease epoch, registers fence guards and reaps leases and the ledger; it is a
member of pgquota_app and pgquota_relay, so it makes their calls too. It
holds no table write either: every change goes through pgquota's SECURITY
DEFINER functions. Attaching a fence guard also needs the guarded table's
owner (CREATE TRIGGER). Run it as the owner of schema pgquota after pgquota
migrate up; it creates pgquota_operator when it is missing (that needs
CREATEROLE).`,
		`  pgquota migrate grant-operator --role ops`)
}

func (a *app) grantRoleCommand(use, group, short, long, example string) *cobra.Command {
	var role string
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Long:    long,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			// Roles and privileges are set on a Citus coordinator, which
			// propagates them; a worker refuses (naming the coordinator).
			sqlDB := stdlib.OpenDBFromPool(pool)
			err = migrations.CheckNotCitusWorker(ctx, sqlDB)
			_ = sqlDB.Close()
			if err != nil {
				return fmt.Errorf("migrate %s: %w", use, err)
			}
			created, err := grantRole(ctx, pool.Begin, group, role)
			if err != nil {
				return fmt.Errorf("migrate %s: %w", use, err)
			}
			out := struct {
				Connection target `json:"connection"`
				AppRole    string `json:"app_role"`
				Created    bool   `json:"created"`
				Member     string `json:"member"`
			}{*a.target, group, created, role}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "database", out.Connection.brief())
				if created {
					row(w, "created role", group)
				}
				row(w, "granted", group+" on schema "+migrations.Schema)
				if role != "" {
					row(w, "member", role+" of "+group)
				}
			})
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "make this existing role (the login role) a member of "+group)
	return cmd
}

// grantRole runs grant-app, grant-relay or grant-operator (group) in one
// transaction that holds the migration lock (transaction-level, so
// concurrent grants and migrations of this database never update the same
// privileges at once). It reports whether it created group.
func grantRole(ctx context.Context, begin func(context.Context) (pgx.Tx, error), group, role string) (created bool, err error) {
	tx, err := begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('pgquota.migrate', 0))`); err != nil {
		return false, err
	}
	var hasFunc, hasModel, hasRole, hasMember bool
	if err := tx.QueryRow(ctx, `
		SELECT to_regprocedure('pgquota.grant_app(name)') IS NOT NULL, to_regprocedure('pgquota.grant_roles()') IS NOT NULL,
		       to_regrole($1) IS NOT NULL, $2 = '' OR to_regrole($2) IS NOT NULL`, group, role).Scan(&hasFunc, &hasModel, &hasRole, &hasMember); err != nil {
		return false, err
	}
	if !hasFunc || (group != migrations.AppRole && !hasModel) {
		return false, errors.New("schema pgquota is behind this build (no pgquota.grant_roles, migration 00022): run pgquota migrate up first")
	}
	if !hasMember {
		return false, fmt.Errorf("role %q does not exist: create it first (CREATE ROLE %s LOGIN)", role, pgx.Identifier{role}.Sanitize())
	}
	if !hasRole {
		if _, err := tx.Exec(ctx, `CREATE ROLE `+group+` NOLOGIN`); err != nil {
			if isInsufficientPrivilege(err) {
				return false, fmt.Errorf("%w: this role may not create roles: as a role with CREATEROLE run CREATE ROLE %s NOLOGIN, then run this again", err, group)
			}
			return false, err
		}
		created = true
	}
	if group == migrations.OperatorRole {
		// The operator makes the application's and the relay's calls too.
		for _, sub := range []string{migrations.AppRole, migrations.RelayRole} {
			var exists, member bool
			if err := tx.QueryRow(ctx, `SELECT to_regrole($1) IS NOT NULL, to_regrole($1) IS NOT NULL AND pg_has_role($2, $1, 'MEMBER')`,
				sub, group).Scan(&exists, &member); err != nil {
				return false, err
			}
			if !exists {
				if _, err := tx.Exec(ctx, `CREATE ROLE `+sub+` NOLOGIN`); err != nil {
					return false, err
				}
			}
			if !member {
				if _, err := tx.Exec(ctx, `GRANT `+sub+` TO `+group); err != nil {
					return false, err
				}
			}
		}
	}
	if _, err := tx.Exec(ctx, `SELECT pgquota.grant_app($1)`, migrations.AppRole); err != nil {
		if isInsufficientPrivilege(err) {
			return false, fmt.Errorf("%w: run this as the owner of schema %s (the role that migrated it)", err, migrations.Schema)
		}
		return false, err
	}
	if role != "" {
		if _, err := tx.Exec(ctx, `GRANT `+group+` TO `+pgx.Identifier{role}.Sanitize()); err != nil {
			if isInsufficientPrivilege(err) {
				return false, fmt.Errorf("%w: granting membership in %s needs CREATEROLE or its ADMIN OPTION: as such a role run GRANT %s TO %s",
					err, group, group, pgx.Identifier{role}.Sanitize())
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
