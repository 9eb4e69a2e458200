package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

func (a *app) fenceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Fenced rows: writes that land only with a token no lower than any seen",
		Long: `The database keeps the highest fencing token it has seen per resource and
rejects a write that carries a lower one, whichever key it touches (exit 3,
SQLSTATE PQ001). Equal tokens are accepted: the current holder may write again.`,
	}
	var resource, key, value, lease, table, column string
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
zxid); the highest-token check still applies.`,
		Example: `  pgquota fence write --resource report --key status --token 42 --value done
  pgquota fence write --resource orders --key o-17 --token 7719 --value paid --external`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if external && cmd.Flags().Changed("lease") {
				return usagef("--lease and --external exclude each other")
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			req := quota.FenceWriteRequest{Resource: resource, Key: key, Value: value, Token: token, Lease: lease}
			if req.Lease == "" && !external {
				req.Lease = resource
			}
			r, err := c.FenceWrite(cmd.Context(), req)
			if errors.Is(err, quota.ErrStaleToken) || errors.Is(err, quota.ErrLeaseLost) {
				msg := oneLine(trimPrefix(err.Error()))
				if errors.Is(err, quota.ErrLeaseLost) && !cmd.Flags().Changed("lease") {
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
	write.Flags().StringVar(&lease, "lease", "", "the pgquota lease, held now, that issued --token (default: the lease named like --resource)")
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
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			st, err := c.Fence(cmd.Context(), resource)
			if err != nil {
				return err
			}
			var rows []quota.FencedRow
			if key != "" {
				r, err := c.FencedRow(cmd.Context(), resource, key)
				if err != nil && !errors.Is(err, quota.ErrFencedRowNotFound) {
					return err
				}
				if err == nil {
					rows = append(rows, r)
				}
			} else if rows, err = c.FencedRows(cmd.Context(), resource); err != nil {
				return err
			}
			if rows == nil {
				rows = []quota.FencedRow{}
			}
			out := struct {
				quota.FenceState
				Rows []quota.FencedRow `json:"rows"`
			}{st, rows}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "resource", st.Resource)
				row(w, "highest token", st.Highest)
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
		Short: "Attach the fence guard trigger to an application table's token column",
		Long: `Attach pgquota's guard trigger to --table, whose --column holds each row's
fencing token: from then on the database rejects any INSERT or UPDATE of the
table whose token is NULL or below the highest token seen for the table,
with SQLSTATE PQ001, also from code that bypasses pgquota. Running it again
is harmless. Detach with: DROP TRIGGER pgquota_fence_guard ON <table>.`,
		Example: `  pgquota fence guard --table app.orders --column fence_token`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			g, err := c.AttachFenceGuard(cmd.Context(), table, column)
			if err != nil {
				return err
			}
			return a.output(g, func(w *tabwriter.Writer) {
				row(w, "table", g.Table)
				row(w, "column", g.Column)
				row(w, "resource", g.Resource)
				row(w, "trigger", g.Trigger)
				row(w, "rejects", "SQLSTATE "+quota.SQLStateStaleToken+" (stale fencing token)")
			})
		},
	}
	guard.Flags().StringVar(&table, "table", "", "table, optionally schema-qualified (required)")
	guard.Flags().StringVar(&column, "column", "", "token column (required)")
	_ = guard.MarkFlagRequired("table")
	_ = guard.MarkFlagRequired("column")

	cmd.AddCommand(write, show, guard)
	return cmd
}

func printFencedRow(w *tabwriter.Writer, r quota.FencedRow) {
	row(w, "resource", r.Resource)
	row(w, "key", r.Key)
	row(w, "token", r.Token)
	row(w, "value", r.Value)
	row(w, "updated at", stamp(r.UpdatedAt))
}
