package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

func (a *app) ledgerCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Inspect and reap the grant ledger (operations made with an idempotency key)",
	}

	var grantID int64
	var key quota.IdempotencyKey
	show := &cobra.Command{
		Use:   "show",
		Short: "Print one ledger entry: the request, its outcome and any compensation",
		Example: `  pgquota ledger show --grant-id 42
  pgquota ledger show --scope points --key order-1234`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			byID := cmd.Flags().Changed("grant-id")
			byKey := cmd.Flags().Changed("scope") || cmd.Flags().Changed("key")
			if byID == byKey {
				return usagef("give either --grant-id, or --scope and --key")
			}
			if byKey && (!cmd.Flags().Changed("scope") || !cmd.Flags().Changed("key")) {
				return usagef("--key and --scope go together: give both (the scope is the quota or campaign name unless the operation gave --idempotency-scope)")
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			var e quota.LedgerEntry
			if byID {
				e, err = c.LedgerEntry(cmd.Context(), grantID)
			} else {
				e, err = c.LedgerEntryByKey(cmd.Context(), key)
			}
			if err != nil {
				return err
			}
			return a.output(e, func(w *tabwriter.Writer) { ledgerRows(w, e) })
		},
	}
	show.Flags().Int64Var(&grantID, "grant-id", 0, "the entry's grant id")
	show.Flags().StringVar(&key.Scope, "scope", "", "the idempotency scope (with --key)")
	show.Flags().StringVar(&key.Key, "key", "", "the idempotency key (with --scope)")

	var olderThan time.Duration
	reap := &cobra.Command{
		Use:   "reap",
		Short: "Delete ledger entries older than --older-than (their keys become free again)",
		Long: `Delete ledger entries created more than --older-than ago, by the database
clock. A reaped key is forgotten: a repeat of its operation runs again, and a
reaped grant can no longer be compensated (pgquota compensate). Keep entries for longer
than any client retries, and than you may need to compensate grants.`,
		Example: `  pgquota ledger reap --older-than 720h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			n, err := c.ReapLedger(cmd.Context(), olderThan)
			if err != nil {
				return err
			}
			out := struct {
				Deleted     int64 `json:"deleted"`
				OlderThanMS int64 `json:"older_than_ms"`
			}{n, olderThan.Milliseconds()}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "deleted", n)
				row(w, "older than", olderThan)
			})
		},
	}
	reap.Flags().DurationVar(&olderThan, "older-than", 0, "delete entries older than this, e.g. 720h (required)")
	_ = reap.MarkFlagRequired("older-than")

	cmd.AddCommand(show, reap)
	return cmd
}

func ledgerRows(w *tabwriter.Writer, e quota.LedgerEntry) {
	row(w, "grant id", e.GrantID)
	row(w, "idempotency key", e.IdempotencyKey+" (scope "+e.IdempotencyScope+")")
	row(w, "operation", e.Operation)
	switch e.Operation {
	case quota.OpClaim:
		row(w, "campaign", e.Target)
	default:
		row(w, "quota", e.Target)
	}
	row(w, "member", e.Member)
	row(w, "created at", stamp(e.CreatedAt))
	switch e.Operation {
	case quota.OpGrant:
		row(w, "amount", e.Amount)
		if e.RequestLimit != nil {
			row(w, "limit asked", *e.RequestLimit)
		}
		row(w, "granted", yesNo(e.Granted))
		row(w, "used", e.Used)
		row(w, "limit", e.Limit)
		row(w, "window", window(e.WindowStart, e.WindowEnd))
	case quota.OpRevoke:
		row(w, "amount", e.Amount)
		row(w, "revoked", e.Revoked)
		row(w, "used", e.Used)
		row(w, "window", window(e.WindowStart, e.WindowEnd))
	case quota.OpClaim:
		row(w, "claimed", yesNo(e.Granted))
		if e.Repeat {
			row(w, "repeat", "yes (the member's earlier claim)")
		}
		switch {
		case e.Code != "":
			row(w, "code", e.Code)
		case e.Seq > 0:
			row(w, "unit", fmt.Sprintf("%d of %d", e.Seq, e.Limit))
		}
	}
	if e.Compensation != nil {
		row(w, "compensated", fmt.Sprintf("%d units revoked at %s (used after: %d)",
			e.Compensation.Revoked, stamp(e.Compensation.At), e.Compensation.Used))
	}
}
