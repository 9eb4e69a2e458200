package cli

import (
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

func (a *app) grantCommand() *cobra.Command {
	var req quota.GrantRequest
	var limit int64
	cmd := &cobra.Command{
		Use:   "grant",
		Short: "Grant units of a quota to a member, if the limit allows (exit 3 when denied)",
		Long: `Grant --amount units of a quota to a member in the current window, in one
conditional statement: granted only if the member's counter stays at or below
the limit. The limit is --limit, else the member's own limit, else the quota's
default. Exit status 0 when granted, 3 when denied.`,
		Example: `  pgquota grant --quota api-calls --member acme
  pgquota grant --quota vouchers --member alice --limit 1 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("limit") {
				req.Limit = &limit
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			res, err := c.Grant(cmd.Context(), req)
			if err != nil {
				return err
			}
			if err := a.output(res, func(w *tabwriter.Writer) {
				row(w, "granted", yesNo(res.Granted))
				row(w, "quota", res.Quota)
				row(w, "member", res.Member)
				row(w, "amount", res.Amount)
				row(w, "used", res.Used)
				row(w, "limit", res.Limit)
				row(w, "remaining", res.Remaining)
				row(w, "window", window(res.WindowStart, res.WindowEnd))
			}); err != nil {
				return err
			}
			if !res.Granted {
				return errDenied
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Quota, "quota", "", "quota name (required)")
	cmd.Flags().StringVar(&req.Member, "member", "", "member (required)")
	cmd.Flags().Int64Var(&req.Amount, "amount", 1, "units to grant")
	cmd.Flags().Int64Var(&limit, "limit", 0, "limit for this call (default: the member's limit, else the quota's)")
	_ = cmd.MarkFlagRequired("quota")
	_ = cmd.MarkFlagRequired("member")
	return cmd
}

func (a *app) revokeCommand() *cobra.Command {
	var req quota.RevokeRequest
	cmd := &cobra.Command{
		Use:     "revoke",
		Short:   "Give units of a member's current window back (never below zero)",
		Example: `  pgquota revoke --quota api-calls --member acme --amount 3`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			res, err := c.Revoke(cmd.Context(), req)
			if err != nil {
				return err
			}
			return a.output(res, func(w *tabwriter.Writer) {
				row(w, "revoked", res.Revoked)
				row(w, "quota", res.Quota)
				row(w, "member", res.Member)
				row(w, "used", res.Used)
				row(w, "window", window(res.WindowStart, res.WindowEnd))
			})
		},
	}
	cmd.Flags().StringVar(&req.Quota, "quota", "", "quota name (required)")
	cmd.Flags().StringVar(&req.Member, "member", "", "member (required)")
	cmd.Flags().Int64Var(&req.Amount, "amount", 0, "units to give back (required)")
	_ = cmd.MarkFlagRequired("quota")
	_ = cmd.MarkFlagRequired("member")
	_ = cmd.MarkFlagRequired("amount")
	return cmd
}

func (a *app) usageCommand() *cobra.Command {
	var quotaName, member string
	cmd := &cobra.Command{
		Use:     "usage",
		Short:   "Show a member's usage of a quota in the current window",
		Example: `  pgquota usage --quota api-calls --member acme`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			u, err := c.Usage(cmd.Context(), quotaName, member)
			if err != nil {
				return err
			}
			return a.output(u, func(w *tabwriter.Writer) {
				row(w, "quota", u.Quota)
				row(w, "member", u.Member)
				row(w, "used", u.Used)
				if u.HasLimit {
					row(w, "limit", u.Limit)
					row(w, "remaining", u.Remaining)
				} else {
					row(w, "limit", "- (none: give --limit when granting)")
				}
				row(w, "window", window(u.WindowStart, u.WindowEnd))
			})
		},
	}
	cmd.Flags().StringVar(&quotaName, "quota", "", "quota name (required)")
	cmd.Flags().StringVar(&member, "member", "", "member (required)")
	_ = cmd.MarkFlagRequired("quota")
	_ = cmd.MarkFlagRequired("member")
	return cmd
}
