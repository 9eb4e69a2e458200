package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

func (a *app) fenceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Fenced rows: writes that land only with a token no lower than any seen",
		Long: `The database keeps the highest fencing token it has seen per resource and
rejects a write that carries a lower one, whichever key it touches (exit 3,
SQLSTATE PQ001). Equal tokens are accepted: the current holder may write again.`,
	}
	var resource, key, value, leaseName, table, column, semaphore string
	var token int64
	var external bool

	write := &cobra.Command{
		Use:   "write",
		Short: "Write a fenced value with a token (exit 3 when the token is stale)",
		Long: `Write --value under --key of --resource, carrying fencing token --token. The
write lands only if --token is at least the highest token the resource has
seen, whichever key that was for; otherwise exit 3 (SQLSTATE PQ001).

The token must also belong to the pgquota lease that is held now, and by
default that is the lease named like the resource: --resource report checks
lease "report". --lease NAME checks the lease NAME instead. A token of a
lease that expired, was released, or never issued it is refused: exit 3
(SQLSTATE PQ002). --external skips the lease check, for tokens from another
lock service that increase with each holder (an etcd revision, a ZooKeeper
zxid); the highest-token check still applies.

On the resource of a guarded table the binding decides (see fence guard): a
token of another lease than the one the table is bound to is refused, exit 3
(SQLSTATE PQ004), and moves no mark.`,
		Example: `  pgquota fence write --resource report --key status --token 42 --value done
  pgquota fence write --resource orders --key o-17 --token 7719 --value paid --external`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if external && cmd.Flags().Changed("lease") {
				return usagef("--lease and --external exclude each other")
			}
			c, err := a.fenceClient(cmd.Context())
			if err != nil {
				return err
			}
			req := fence.WriteRowRequest{Resource: resource, Key: key, Value: value, Token: token, Lease: leaseName}
			if req.Lease == "" && !external {
				req.Lease = resource
			}
			r, err := c.WriteRow(cmd.Context(), req)
			if errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost) || errors.Is(err, fence.ErrWrongLease) {
				msg := oneLine(trimPrefix(err.Error()))
				if errors.Is(err, lease.ErrLost) && !cmd.Flags().Changed("lease") {
					msg += fmt.Sprintf("; the token must belong to the lease held now under the name %q (--lease defaults to --resource): "+
						"give --lease NAME for a lease named otherwise, or --external for a token from another lock service", req.Lease)
				}
				fmt.Fprintln(a.stderr, "pgquota: "+msg)
				return errDenied
			}
			if err != nil {
				return err
			}
			return a.output(r, func(w *tabwriter.Writer) {
				row(w, "written", "yes")
				printFencedRow(w, r)
			})
		},
	}
	write.Flags().StringVar(&resource, "resource", "", "fenced resource (required)")
	write.Flags().StringVar(&key, "key", "", "key within the resource (required)")
	write.Flags().Int64Var(&token, "token", 0, "fencing token (required)")
	write.Flags().StringVar(&value, "value", "", "value to write")
	write.Flags().StringVar(&leaseName, "lease", "", "the pgquota lease, held now, that issued --token (default: the lease named like --resource)")
	write.Flags().BoolVar(&external, "external", false, "the token comes from another lock service (etcd, ZooKeeper): skip the lease check")
	_ = write.MarkFlagRequired("resource")
	_ = write.MarkFlagRequired("key")
	_ = write.MarkFlagRequired("token")

	show := &cobra.Command{
		Use:     "show",
		Short:   "Show a resource's highest token and its fenced rows (or one --key)",
		Example: `  pgquota fence show --resource report`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.fenceClient(cmd.Context())
			if err != nil {
				return err
			}
			st, err := c.State(cmd.Context(), resource)
			if err != nil {
				return err
			}
			var rows []fence.Row
			if key != "" {
				r, err := c.Row(cmd.Context(), resource, key)
				if err != nil && !errors.Is(err, fence.ErrRowNotFound) {
					return err
				}
				if err == nil {
					rows = append(rows, r)
				}
			} else if rows, err = c.Rows(cmd.Context(), resource); err != nil {
				return err
			}
			if rows == nil {
				rows = []fence.Row{}
			}
			all, err := c.GuardedTables(cmd.Context())
			if err != nil {
				return err
			}
			guards := []fence.GuardStatus{}
			for _, g := range all {
				if g.Resource == resource {
					guards = append(guards, g)
				}
			}
			out := struct {
				fence.State
				Guards []fence.GuardStatus `json:"guards"`
				Rows   []fence.Row         `json:"rows"`
			}{st, guards, rows}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "resource", st.Resource)
				row(w, "highest token", st.Highest)
				for _, g := range guards {
					row(w, "guarded table", g.Table+" "+guardFires(g))
				}
				if len(rows) == 0 {
					row(w, "rows", "(none)")
					return
				}
				fmt.Fprintln(w)
				row(w, "KEY", "TOKEN", "UPDATED", "VALUE")
				for _, r := range rows {
					row(w, r.Key, r.Token, stamp(r.UpdatedAt), r.Value)
				}
			})
		},
	}
	show.Flags().StringVar(&resource, "resource", "", "fenced resource (required)")
	show.Flags().StringVar(&key, "key", "", "show only this key")
	_ = show.MarkFlagRequired("resource")

	guard := &cobra.Command{
		Use:   "guard",
		Short: "Attach the fence guard to an application table: every statement needs a current token",
		Long: `Attach pgquota's guard triggers to --table, whose --column (bigint) records
each row's fencing token. From then on every INSERT, UPDATE, DELETE and
TRUNCATE of the table, also from code that bypasses pgquota, lands only when
its transaction first presented a current token for the table's resource
(printed as "resource"), whatever columns it sets:

  BEGIN;
  SELECT pgquota.present_token('public.orders', 42);
  UPDATE public.orders SET status = 'paid' WHERE id = 1;
  COMMIT;

The guard stamps the presented token into --column of every row written.
A statement in a transaction that presented no token is refused with SQLSTATE
PQ003; present_token refuses a token below the highest seen with PQ001, and a
token the lease named like the resource is not held with (expired, released,
never issued: too high or invented) with PQ002; so does a guarded statement
whose presented token was overtaken (PQ001).

The table is bound to one source of tokens. By default that is the lease
named like the resource; --lease NAME binds it to lease NAME, --semaphore NAME
to every slot of semaphore NAME held now (each holder presents its own token;
none locks another out). A token of any other lease is refused with SQLSTATE
PQ004, and moves no mark.

--external is for tokens from another lock service that increase with each
holder (an etcd revision, a ZooKeeper zxid): present_token then checks a
token only against the highest seen for the resource, and no lease.

Running it again is harmless, and replaces a guard attached by an older
pgquota (which read the token from the row and guarded neither DELETE nor
TRUNCATE): "upgraded yes". Detach with:
  DROP TRIGGER pgquota_fence_guard ON <table>;
  DROP TRIGGER pgquota_fence_guard_truncate ON <table>;`,
		Example: `  pgquota fence guard --table app.orders --column fence_token
  pgquota fence guard --table app.orders --column zxid --external`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.fenceClient(cmd.Context())
			if err != nil {
				return err
			}
			g, err := c.GuardTable(cmd.Context(), fence.GuardTableRequest{
				Table: table, Column: column, External: external, Lease: leaseName, Semaphore: semaphore,
			})
			if err != nil {
				return err
			}
			return a.output(g, func(w *tabwriter.Writer) {
				row(w, "table", g.Table)
				row(w, "column", g.Column)
				row(w, "resource", g.Resource)
				switch {
				case g.External:
					row(w, "tokens", "external (checked against the highest seen for the resource only; no lease)")
				case g.Semaphore != "":
					row(w, "tokens", fmt.Sprintf("any slot of semaphore %q held now, with its own token", g.Semaphore))
				default:
					row(w, "tokens", fmt.Sprintf("pgquota lease %q only, while held with the token (any other lease: SQLSTATE %s)", g.Lease, fence.SQLStateWrongLease))
				}
				row(w, "present with", fmt.Sprintf("SELECT pgquota.present_token(%s, <token>); in each writing transaction", sqlLiteral(g.Resource)))
				row(w, "triggers", g.Trigger+" (INSERT, UPDATE, DELETE), "+g.TruncateTrigger+" (TRUNCATE)")
				row(w, "upgraded", yesNo(g.Upgraded))
				row(w, "rejects", "SQLSTATE "+fence.SQLStateTokenNotPresented+" (no token presented), "+
					fence.SQLStateStaleToken+" (stale token), "+fence.SQLStateLeaseNotHeld+" (lease not held with the token)")
			})
		},
	}
	guard.Flags().StringVar(&table, "table", "", "table, optionally schema-qualified (required)")
	guard.Flags().StringVar(&column, "column", "", "bigint token column, stamped with the presented token (required)")
	guard.Flags().BoolVar(&external, "external", false, "tokens come from another lock service (etcd, ZooKeeper): check them against the highest seen only, no lease")
	guard.Flags().StringVar(&leaseName, "lease", "", "bind the table to this pgquota lease (default: the lease named like the table's resource)")
	guard.Flags().StringVar(&semaphore, "semaphore", "", "bind the table to this semaphore: every slot held now writes with its own token")
	guard.MarkFlagsMutuallyExclusive("external", "lease", "semaphore")
	_ = guard.MarkFlagRequired("table")
	_ = guard.MarkFlagRequired("column")

	guards := &cobra.Command{
		Use:   "guards",
		Short: "List guarded tables and whether each guard fires (exit 3 when one does not)",
		Long: `List every table guarded by "fence guard", with whether its guard fires for
ordinary writes. A guard does not fire when its trigger was disabled (ALTER
TABLE ... DISABLE TRIGGER), set to fire only in replica sessions (ENABLE
REPLICA TRIGGER) or dropped, or when a role or database is set to
session_replication_role = replica (its sessions bypass triggers that fire in
origin sessions only, the default). Exit 3 when any guard does not fire.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.fenceClient(cmd.Context())
			if err != nil {
				return err
			}
			gs, err := c.GuardedTables(cmd.Context())
			if err != nil {
				return err
			}
			if gs == nil {
				gs = []fence.GuardStatus{}
			}
			if err := a.output(gs, func(w *tabwriter.Writer) {
				row(w, "TABLE", "RESOURCE", "FIRES")
				for _, g := range gs {
					row(w, g.Table, g.Resource, guardFires(g))
				}
			}); err != nil {
				return err
			}
			for _, g := range gs {
				if !g.Fires {
					return errDenied
				}
			}
			return nil
		},
	}

	cmd.AddCommand(write, show, guard, guards)
	return cmd
}

// guardFires is "yes", or "NO: " and the problem.
func guardFires(g fence.GuardStatus) string {
	if g.Fires {
		return "yes"
	}
	return "NO: " + g.Problem
}

func printFencedRow(w *tabwriter.Writer, r fence.Row) {
	row(w, "resource", r.Resource)
	row(w, "key", r.Key)
	row(w, "token", r.Token)
	row(w, "value", r.Value)
	row(w, "updated at", stamp(r.UpdatedAt))
}

// sqlLiteral quotes s as a standard SQL string literal, for messages that
// show a statement to copy.
func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
