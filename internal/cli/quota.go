package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

func (a *app) quotaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Define and list quotas, and set per-member limits",
	}

	var def quota.Definition
	var window string
	var limit int64
	var shape shapeFlags
	define := &cobra.Command{
		Use:   "define",
		Short: "Create or redefine a quota: its window (or rate), time zone and default limit",
		Long: `Create or redefine a quota. Its kind is one of:
  --window hour|day|week|month|none  a counter per calendar window in --tz
  --window 10s|1m|15m|36h            a counter per fixed window of that length,
                                     cut at --origin + k * length (default origin:
                                     the Unix epoch)
  --rolling 1h                       at most --limit units in any period of that
                                     length (exact; --limit at most 10000)
  --rate 10/s [--burst 20]           a rate with a burst (GCRA): 10 units per
                                     second, at most 20 at once (default burst:
                                     the rate's count); N/s, N/m, N/h, N/d or
                                     N/<duration> such as 5/10s
--limit is the default limit per member (a member's own limit, set-limit,
replaces it; for a rate it replaces the count per period).

Redefining a quota with the same kind keeps its counters. Changing the kind
of an existing quota (day to a rate, say) needs --replace-kind, which deletes
its counters of every kind: every member starts from zero, and no old counter
comes back if the quota is switched back (member limits stay). Without it the
command fails and changes nothing.`,
		Example: `  pgquota quota define --name api-calls --window day --tz Europe/Berlin --limit 1000
  pgquota quota define --name signup-bonus --window none --limit 1
  pgquota quota define --name api-rate --rate 10/s --burst 20
  pgquota quota define --name bursts --window 10s --limit 50
  pgquota quota define --name shifts --window 36h --origin 2026-01-05T06:00:00Z --limit 500
  pgquota quota define --name sends --rolling 1h --limit 100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("limit") {
				def.DefaultLimit = &limit
			}
			if err := shape.apply(cmd, window, &def); err != nil {
				return err
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			q, err := c.DefineQuota(cmd.Context(), def)
			if err != nil {
				return err
			}
			return a.printQuotas([]quota.Quota{q}, true)
		},
	}
	define.Flags().StringVar(&def.Name, "name", "", "quota name (required)")
	define.Flags().StringVar(&window, "window", "", "window: hour, day, week, month, none, or a length such as 10s, 15m, 36h (one of --window, --rolling, --rate is required)")
	define.Flags().StringVar(&def.TimeZone, "tz", "UTC", "IANA time zone the windows are cut in")
	define.Flags().Int64Var(&limit, "limit", 0, "default limit per member and window (none when omitted)")
	define.Flags().BoolVar(&def.ReplaceKind, "replace-kind", false, "allow changing an existing quota's kind (window or rate); deletes its counters")
	shape.register(define)
	_ = define.MarkFlagRequired("name")

	list := &cobra.Command{
		Use:   "list",
		Short: "List defined quotas (per-member limits: quota limits --name N)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			qs, err := c.Quotas(cmd.Context())
			if err != nil {
				return err
			}
			return a.printQuotas(qs, false)
		},
	}

	var ml struct {
		quota, member string
		limit         int64
		clear         bool
	}
	setLimit := &cobra.Command{
		Use:   "set-limit",
		Short: "Give a member its own limit for a quota (or --clear it)",
		Example: `  pgquota quota set-limit --name api-calls --member acme --limit 5000
  pgquota quota set-limit --name api-calls --member acme --clear`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ml.clear == cmd.Flags().Changed("limit") {
				return usagef("give exactly one of --limit and --clear")
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			if ml.clear {
				had, err := c.ClearMemberLimit(cmd.Context(), ml.quota, ml.member)
				if err != nil {
					return err
				}
				out := struct {
					Quota   string `json:"quota"`
					Member  string `json:"member"`
					Cleared bool   `json:"cleared"`
				}{ml.quota, ml.member, had}
				return a.output(out, func(w *tabwriter.Writer) {
					row(w, "quota", out.Quota)
					row(w, "member", out.Member)
					row(w, "cleared", yesNo(had))
				})
			}
			m, err := c.SetMemberLimit(cmd.Context(), ml.quota, ml.member, ml.limit)
			if err != nil {
				return err
			}
			return a.output(m, func(w *tabwriter.Writer) {
				row(w, "quota", m.Quota)
				row(w, "member", m.Member)
				row(w, "limit", m.Limit)
			})
		},
	}
	setLimit.Flags().StringVar(&ml.quota, "name", "", "quota name (required)")
	setLimit.Flags().StringVar(&ml.member, "member", "", "member (required)")
	setLimit.Flags().Int64Var(&ml.limit, "limit", 0, "the member's limit per window")
	setLimit.Flags().BoolVar(&ml.clear, "clear", false, "remove the member's limit")
	_ = setLimit.MarkFlagRequired("name")
	_ = setLimit.MarkFlagRequired("member")

	var limitsOf string
	limits := &cobra.Command{
		Use:     "limits",
		Short:   "List the members of a quota that have their own limit (set-limit)",
		Example: `  pgquota quota limits --name api-calls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			ms, err := c.MemberLimits(cmd.Context(), limitsOf)
			if err != nil {
				return err
			}
			return a.output(ms, func(w *tabwriter.Writer) {
				if len(ms) == 0 {
					row(w, fmt.Sprintf("no member of %s has a limit of its own: the quota's default applies", limitsOf))
					return
				}
				row(w, "MEMBER", "LIMIT", "UPDATED")
				for _, m := range ms {
					row(w, m.Member, m.Limit, stamp(m.UpdatedAt))
				}
			})
		},
	}
	limits.Flags().StringVar(&limitsOf, "name", "", "quota name (required)")
	_ = limits.MarkFlagRequired("name")

	cmd.AddCommand(define, list, setLimit, limits)
	return cmd
}

func (a *app) printQuotas(qs []quota.Quota, single bool) error {
	limit := func(q quota.Quota) any {
		if q.DefaultLimit == nil {
			return "-"
		}
		return *q.DefaultLimit
	}
	var v any = qs
	if single {
		v = qs[0]
	}
	return a.output(v, func(w *tabwriter.Writer) {
		if single {
			q := qs[0]
			row(w, "name", q.Name)
			row(w, "window", q.Window)
			row(w, "time zone", q.TimeZone)
			row(w, "default limit", limit(q))
			shapeRows(w, q)
			return
		}
		row(w, "NAME", "WINDOW", "TIME ZONE", "DEFAULT LIMIT")
		for _, q := range qs {
			row(w, q.Name, q.Window, q.TimeZone, limit(q))
		}
	})
}
