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
	var quotas []string
	var file fileOptions
	cmd := &cobra.Command{
		Use:   "grant",
		Short: "Grant units of a quota to a member, if the limit allows (exit 3 when denied); or every row of a CSV file",
		Long: `Grant --amount units of a quota to a member in the current window, in one
conditional statement: granted only if the member's counter stays at or below
the limit. The limit is --limit, else the member's own limit, else the quota's
default. Exit status 0 when granted, 3 when denied.

Repeat --quota to grant against several quotas at once: the units are granted
under all of them or none, and a denial names the quota that refused
("denied by") and when to retry. Every grant prints "retry after" (how long
until the same grant can succeed, by the database clock: 0s when granted, the
time to the window's end for a calendar or fixed window, "never" when no wait
helps) and "reset after" (until every quota is back at its full limit).

With --idempotency-key the grant is recorded in the ledger under a grant id,
and running the same command again (after a timeout, say) prints the first
outcome and grants nothing more; the same key with other flags is an error.
The key is unique within --idempotency-scope, which defaults to the quota.

With --file, grant every row of a CSV file instead. Its header names the
columns quota,member,amount and optionally limit and idempotency_key; each
row is one grant, as above. Rows are granted in batches, one statement and
one durable commit per batch of --batch-size rows, with --workers batches in
flight at once; the rows of one member are decided one after another in file
order, so the same member several times in a file respects its limit
exactly. A bad row (malformed, a bad value, an undefined quota, no limit) is
reported with its line number on stderr and does not stop the others.
A row with an idempotency_key is recorded in the ledger under a grant id
(scope: its quota), so running the same file again replays those rows and
grants them nothing more.

--out writes every line's outcome (line, status, used, limit, remaining,
grant id and replayed for keyed rows, error) as CSV, or as JSON lines when
the name ends in .jsonl or .ndjson, or with --out - and --json (or with
--out-format). Every line of the file gets one status: granted, denied,
error (a bad row), unknown (its batch was sent but the reply was lost: it
may have committed), not_run (never sent, or its batch failed with nothing
written: safe to run again) or skipped (see --skip-decided). In CSV, used,
limit and remaining are empty unless the row was decided. A progress bar
counting rows runs on stderr when it is a terminal (not with --json). The
summary counts each status and the replayed rows; it goes to stdout, or to
stderr with --out - (stdout then holds the outcomes).

Interrupted (Ctrl-C), the run sends no new batch, lets the batches in
flight commit and report (up to 30s), marks the rest not_run, says it was
interrupted and how to resume: rows with an idempotency_key replay when the
same command runs again; rows without one would be granted again, so give
the interrupted run's --out file to --skip-decided, which skips the lines it
records as granted, denied or skipped.

Exit status with --file: 0 when every row was decided, granted or denied (a
denied row is an outcome, as for a single grant, but the run is not denied
as a whole: read the summary or --out); 2 when some rows had errors (the
others still ran); 1 when the run stopped (interrupted, or the database
failed).`,
		Example: `  pgquota grant --quota api-calls --member acme
  pgquota grant --quota per-second --quota per-hour --member acme
  pgquota grant --quota vouchers --member alice --limit 1 --json
  pgquota grant --quota points --member alice --amount 50 --idempotency-key order-1234
  pgquota grant --file requests.csv --out results.csv
  pgquota grant --file requests.csv --skip-decided results.csv --out results-2.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file.path != "" {
				for _, f := range []string{"quota", "member", "amount", "limit", "idempotency-key", "idempotency-scope"} {
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
			for _, f := range []string{"out", "out-format", "batch-size", "workers", "skip-decided"} {
				if cmd.Flags().Changed(f) {
					return usagef("--%s needs --file", f)
				}
			}
			if cmd.Flags().Changed("limit") {
				req.Limit = &limit
			}
			req.Quota, req.Quotas = quotas[0], nil
			if len(quotas) > 1 {
				req.Quota, req.Quotas = "", quotas
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
				if len(res.Limits) == 0 || !res.WindowEnd.IsZero() {
					row(w, "window", window(res.WindowStart, res.WindowEnd))
				}
				limitRows(w, res)
				keyedRows(w, res.Keyed)
			}); err != nil {
				return err
			}
			if !res.Granted {
				return errDenied
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&quotas, "quota", nil, "quota name (required without --file); repeat it to grant against several quotas at once, all or none")
	cmd.Flags().StringVar(&req.Member, "member", "", "member (required without --file)")
	cmd.Flags().Int64Var(&req.Amount, "amount", 1, "units to grant")
	cmd.Flags().Int64Var(&limit, "limit", 0, "limit for this call (default: the member's limit, else the quota's)")
	cmd.Flags().StringVar(&file.path, "file", "", "grant every row of this CSV file (- for stdin) instead")
	cmd.Flags().StringVar(&file.out, "out", "", "with --file: write each row's outcome to this file (- for stdout)")
	cmd.Flags().StringVar(&file.format, "out-format", "", "with --out: csv or jsonl (default: from the file name, jsonl for --out - with --json, else csv)")
	cmd.Flags().StringVar(&file.skipDecided, "skip-decided", "", "with --file: skip the lines this earlier --out file records as granted, denied or skipped (resume an interrupted run)")
	cmd.Flags().IntVar(&file.batchSize, "batch-size", 2000, "with --file: rows per statement (and per commit)")
	cmd.Flags().IntVar(&file.workers, "workers", 4, "with --file: batches in flight at once, each on its own connection")
	keyFlags(cmd, &req.Idempotency, "the quota")
	return cmd
}

// keyFlags adds --idempotency-key and --idempotency-scope to cmd (whose
// RunE is set), and rejects a scope given without a key: the operation
// would silently run without one.
func keyFlags(cmd *cobra.Command, k *quota.IdempotencyKey, scopeDefault string) {
	cmd.Flags().StringVar(&k.Key, "idempotency-key", "", "record the operation under this key; a repeat prints the first outcome and changes nothing")
	cmd.Flags().StringVar(&k.Scope, "idempotency-scope", "", "namespace of --idempotency-key (default "+scopeDefault+")")
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if cmd.Flags().Changed("idempotency-scope") && !cmd.Flags().Changed("idempotency-key") {
			return usagef("--idempotency-scope names the namespace of --idempotency-key: give both, or neither")
		}
		return run(cmd, args)
	}
}

// keyedRows prints the ledger record of a keyed operation.
func keyedRows(w *tabwriter.Writer, k quota.Keyed) {
	if k.GrantID == 0 {
		return
	}
	row(w, "grant id", k.GrantID)
	row(w, "idempotency key", k.IdempotencyKey+" (scope "+k.IdempotencyScope+")")
	if k.Replayed {
		row(w, "replayed", "yes (the first outcome for this key; nothing changed)")
	} else {
		row(w, "replayed", "no")
	}
}

func (a *app) revokeCommand() *cobra.Command {
	var req quota.RevokeRequest
	cmd := &cobra.Command{
		Use:   "revoke",
		Short: "Give units back to a member's current window",
		Long: `Give up to --amount units back to the member's counter in the current
window, never driving it below zero. --idempotency-key makes a repeat print
the first outcome and give nothing more back.

To give back the units of one keyed grant, exactly once (a compensation),
use pgquota compensate --grant-id G.`,
		Example: `  pgquota revoke --quota api-calls --member acme --amount 3`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("grant-id") {
				return usagef("giving back one grant's units is a compensation: pgquota compensate --grant-id G")
			}
			for _, f := range []string{"quota", "member", "amount"} {
				if !cmd.Flags().Changed(f) {
					return usagef("required flag(s) \"%s\" not set", f)
				}
			}
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
				keyedRows(w, res.Keyed)
			})
		},
	}
	cmd.Flags().StringVar(&req.Quota, "quota", "", "quota name")
	cmd.Flags().StringVar(&req.Member, "member", "", "member")
	cmd.Flags().Int64Var(&req.Amount, "amount", 0, "units to give back")
	cmd.Flags().Int64("grant-id", 0, "")
	_ = cmd.Flags().MarkHidden("grant-id")
	keyFlags(cmd, &req.Idempotency, "the quota")
	return cmd
}

// compensateCommand is Client.CompensateGrant: the compensation of one
// keyed grant (the SQL function pgquota.compensate_grant).
func (a *app) compensateCommand() *cobra.Command {
	var grantID int64
	cmd := &cobra.Command{
		Use:   "compensate",
		Short: "Give back the units of one keyed grant, exactly once (a compensation)",
		Long: `Give back the units of one grant made with --idempotency-key, to the
counter of the grant's own window, exactly once: a repeat prints the first
compensation's outcome and changes nothing. Use it when the side effect the
grant paid for failed for good (a saga's compensation).`,
		Example: `  pgquota compensate --grant-id 42`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("grant-id") {
				return usagef("required flag(s) \"grant-id\" not set")
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			res, err := c.CompensateGrant(cmd.Context(), grantID)
			if err != nil {
				return err
			}
			return a.output(res, func(w *tabwriter.Writer) {
				row(w, "grant id", res.GrantID)
				row(w, "revoked", res.Revoked)
				row(w, "quota", res.Quota)
				row(w, "member", res.Member)
				row(w, "granted", res.Amount)
				row(w, "used", res.Used)
				row(w, "window", window(res.WindowStart, res.WindowEnd))
				row(w, "revoked at", stamp(res.RevokedAt))
				if res.Replayed {
					row(w, "replayed", "yes (compensated before; nothing changed)")
				} else {
					row(w, "replayed", "no")
				}
			})
		},
	}
	cmd.Flags().Int64Var(&grantID, "grant-id", 0, "the keyed grant's id (see its output, or pgquota ledger show)")
	return cmd
}

func (a *app) usageCommand() *cobra.Command {
	var quotaName, member string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show a member's usage of a quota of any kind, writing nothing",
		Long: `Show a member's state under a quota, as the database clock reads it now,
writing nothing: the counter of the current window (calendar and fixed
windows), the units granted in the last period (rolling), or the units a
rate's bucket holds (used is then burst - remaining). "reset after" is the
wait until the member is back at its full limit, "refill after" the wait
until remaining next grows (the window's end, when the oldest grant of a
rolling window leaves it, a rate's next unit). With --json: reset_after_ms
and refill_after_ms, rounded up, -1 for never.`,
		Example: `  pgquota usage --quota api-calls --member acme
  pgquota usage --quota per-second --member acme --json`,
		Args: cobra.NoArgs,
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
				row(w, "kind", u.Window)
				row(w, "used", u.Used)
				if u.HasLimit {
					row(w, "limit", u.Limit)
					row(w, "remaining", u.Remaining)
				} else {
					row(w, "limit", "- (none: give --limit when granting)")
				}
				switch u.Window {
				case quota.WindowRate:
					row(w, "period", u.Period)
					row(w, "burst", u.Burst)
				case quota.WindowFixed, quota.WindowRolling:
					row(w, "length", u.Period)
				}
				if u.Window != quota.WindowRate && u.Window != quota.WindowRolling {
					row(w, "window", window(u.WindowStart, u.WindowEnd))
				}
				row(w, "reset after", waitText(u.ResetAfter))
				row(w, "refill after", waitText(u.RefillAfter))
			})
		},
	}
	cmd.Flags().StringVar(&quotaName, "quota", "", "quota name (required)")
	cmd.Flags().StringVar(&member, "member", "", "member (required)")
	_ = cmd.MarkFlagRequired("quota")
	_ = cmd.MarkFlagRequired("member")
	return cmd
}
