package cli

import (
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

func (a *app) grantCommand() *cobra.Command {
	var req quota.GrantRequest
	var limit int64
	var file fileOptions
	cmd := &cobra.Command{
		Use:   "grant",
		Short: "Grant units of a quota to a member, if the limit allows (exit 3 when denied); or every row of a CSV file",
		Long: `Grant --amount units of a quota to a member in the current window, in one
conditional statement: granted only if the member's counter stays at or below
the limit. The limit is --limit, else the member's own limit, else the quota's
default. Exit status 0 when granted, 3 when denied.

With --file, grant every row of a CSV file instead. Its header names the
columns quota,member,amount and optionally limit and idempotency_key; each
row is one grant, as above. Rows are granted in batches, one statement and
one durable commit per batch of --batch-size rows, with --workers batches in
flight at once; the rows of one member are decided one after another in file
order, so the same member several times in a file respects its limit
exactly. A bad row (malformed, a bad value, an undefined quota, no limit) is
reported with its line number on stderr and does not stop the others.
--out writes every row's outcome (line, status granted/denied/error, used,
limit, remaining, error) as CSV, or as JSON lines when the name ends in
.jsonl or .ndjson (or with --out-format). A progress bar runs on stderr when
it is a terminal (not with --json). The summary counts granted, denied and
errors. Exit status 0 when every row was decided (granted or denied), 2 when
some rows had errors, 1 when the run stopped (the database failed).`,
		Example: `  pgquota grant --quota api-calls --member acme
  pgquota grant --quota vouchers --member alice --limit 1 --json
  pgquota grant --file requests.csv --out results.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file.path != "" {
				for _, f := range []string{"quota", "member", "amount", "limit"} {
					if cmd.Flags().Changed(f) {
						return usagef("--%s cannot be used with --file: the file's rows give it", f)
					}
				}
				return a.grantFile(cmd, file)
			}
			var missing []string
			for _, f := range []string{"member", "quota"} {
				if !cmd.Flags().Changed(f) {
					missing = append(missing, `"`+f+`"`)
				}
			}
			if len(missing) > 0 {
				return usagef("required flag(s) %s not set (or give --file)", strings.Join(missing, ", "))
			}
			for _, f := range []string{"out", "out-format", "batch-size", "workers"} {
				if cmd.Flags().Changed(f) {
					return usagef("--%s needs --file", f)
				}
			}
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
	cmd.Flags().StringVar(&req.Quota, "quota", "", "quota name (required without --file)")
	cmd.Flags().StringVar(&req.Member, "member", "", "member (required without --file)")
	cmd.Flags().Int64Var(&req.Amount, "amount", 1, "units to grant")
	cmd.Flags().Int64Var(&limit, "limit", 0, "limit for this call (default: the member's limit, else the quota's)")
	cmd.Flags().StringVar(&file.path, "file", "", "grant every row of this CSV file (- for stdin) instead")
	cmd.Flags().StringVar(&file.out, "out", "", "with --file: write each row's outcome to this file (- for stdout)")
	cmd.Flags().StringVar(&file.format, "out-format", "", "with --out: csv or jsonl (default: from the file name, else csv)")
	cmd.Flags().IntVar(&file.batchSize, "batch-size", 2000, "with --file: rows per statement (and per commit)")
	cmd.Flags().IntVar(&file.workers, "workers", 4, "with --file: batches in flight at once, each on its own connection")
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
