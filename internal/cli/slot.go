package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota/lease"
)

// slotCommand is `pgquota slot`: concurrency limits (semaphores).
func (a *app) slotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "slot",
		Short: "Concurrency limits: at most --limit holders of a semaphore at once (acquire, renew, release, show)",
		Long: `A semaphore admits at most --limit holders at once. Each holder holds a slot:
a lease named slot:NAME:INDEX with its own fencing token and TTL, so a holder
that crashed frees its slot when its TTL runs out. Renew and release a slot
with its --slot index and --token; fence its writes with the slot's lease
name as the lease (pgquota fence write --resource slot:NAME:INDEX).`,
	}
	var name, holder string
	var limit, index int
	var ttl time.Duration
	var token int64
	var wait bool

	acquire := &cobra.Command{
		Use:   "acquire",
		Short: "Take a slot and print its index and fencing token (exit 3 when --limit slots are held)",
		Example: `  pgquota slot acquire --name encoders --limit 2 --ttl 30s
  pgquota slot acquire --name encoders --limit 2 --ttl 30s --wait --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			if holder == "" {
				holder = defaultHolder()
			}
			req := lease.SlotRequest{Semaphore: name, Limit: limit, Holder: holder, TTL: ttl}
			var s lease.Slot
			if wait {
				s, err = c.AcquireSlotWait(cmd.Context(), req, nil)
			} else {
				s, err = c.AcquireSlot(cmd.Context(), req)
			}
			var full *lease.SemaphoreFullError
			if errors.As(err, &full) {
				fmt.Fprintln(a.stderr, "pgquota: "+trimPrefix(full.Error()))
				if err := a.output(map[string]any{
					"acquired": false, "semaphore": full.Semaphore, "limit": full.Limit, "holders": full.Holders,
					"retry_after_ms": core.WaitMS(full.RetryAfter),
				}, func(w *tabwriter.Writer) {
					row(w, "acquired", "no")
					row(w, "semaphore", full.Semaphore)
					row(w, "holders", fmt.Sprintf("%d of %d", full.Holders, full.Limit))
					row(w, "retry after", full.RetryAfter.Round(time.Millisecond))
				}); err != nil {
					return err
				}
				return errDenied
			}
			if err != nil {
				return err
			}
			return a.printSlot(s, true)
		},
	}
	acquire.Flags().StringVar(&name, "name", "", "semaphore name (required)")
	acquire.Flags().IntVar(&limit, "limit", 0, fmt.Sprintf("most holders at once, 1 to %d (required)", lease.MaxSlotLimit))
	acquire.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "how long the slot is held unless renewed")
	acquire.Flags().StringVar(&holder, "holder", "", "holder name shown to others (default: hostname:pid of the running command)")
	acquire.Flags().BoolVar(&wait, "wait", false, "when the semaphore is full, wait for a slot (until interrupted) instead of exiting 3")
	_ = acquire.MarkFlagRequired("name")
	_ = acquire.MarkFlagRequired("limit")

	slotOf := func() lease.Slot {
		return lease.Slot{Lease: lease.Lease{Name: lease.SlotName(name, index), Token: token}, Semaphore: name, Index: index}
	}
	renew := &cobra.Command{
		Use:     "renew",
		Short:   "Extend a slot held with --token (exit 3 when it was lost)",
		Example: `  pgquota slot renew --name encoders --slot 1 --token 42 --ttl 30s`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			s, err := c.RenewSlot(cmd.Context(), slotOf(), ttl)
			if err != nil {
				return a.leaseLost(err)
			}
			return a.printSlot(s, false)
		},
	}
	release := &cobra.Command{
		Use:     "release",
		Short:   "Release a slot held with --token (exit 3 when it was lost)",
		Example: `  pgquota slot release --name encoders --slot 1 --token 42`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			s, err := c.ReleaseSlot(cmd.Context(), slotOf())
			if err != nil {
				return a.leaseLost(err)
			}
			return a.printSlot(s, false)
		},
	}
	for _, c := range []*cobra.Command{renew, release} {
		c.Flags().StringVar(&name, "name", "", "semaphore name (required)")
		c.Flags().IntVar(&index, "slot", -1, "the slot's index, as acquire printed it (required)")
		c.Flags().Int64Var(&token, "token", 0, "the slot's fencing token (required)")
		_ = c.MarkFlagRequired("name")
		_ = c.MarkFlagRequired("slot")
		_ = c.MarkFlagRequired("token")
	}
	renew.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "new time to live, from now")

	show := &cobra.Command{
		Use:     "show",
		Short:   "Show a semaphore: its limit and the holders of its slots",
		Example: `  pgquota slot show --name encoders`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			st, err := c.Semaphore(cmd.Context(), name)
			if err != nil {
				return err
			}
			out := struct {
				Semaphore    string     `json:"semaphore"`
				Limit        int        `json:"limit"`
				Acquisitions int64      `json:"acquisitions"`
				Holders      int        `json:"holders"`
				DBNow        time.Time  `json:"db_now"`
				Slots        []slotJSON `json:"slots"`
			}{st.Name, st.Limit, st.Acquisitions, st.Held, st.DBNow, []slotJSON{}}
			for _, s := range st.Slots {
				out.Slots = append(out.Slots, slotOut(s))
			}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "semaphore", st.Name)
				row(w, "held", fmt.Sprintf("%d of %d", st.Held, st.Limit))
				row(w, "acquisitions", st.Acquisitions)
				if len(st.Holders()) > 0 {
					row(w, "")
					row(w, "SLOT", "TOKEN", "HOLDER", "ACQUIRED AT", "EXPIRES AT", "REMAINING")
					for _, s := range st.Holders() {
						row(w, s.Index, s.Token, s.Holder, stamp(s.AcquiredAt), stamp(s.ExpiresAt), s.Remaining().Round(time.Millisecond))
					}
				}
			})
		},
	}
	show.Flags().StringVar(&name, "name", "", "semaphore name (required)")
	_ = show.MarkFlagRequired("name")

	cmd.AddCommand(acquire, renew, release, show)
	return cmd
}

func (a *app) printSlot(s lease.Slot, acquired bool) error {
	out := struct {
		slotJSON
		Acquired bool `json:"acquired"`
		Holders  int  `json:"holders"`
	}{slotOut(s), acquired, s.Holders}
	return a.output(out, func(w *tabwriter.Writer) {
		if acquired {
			row(w, "acquired", "yes")
		}
		row(w, "semaphore", s.Semaphore)
		row(w, "slot", s.Index)
		row(w, "lease", s.Name)
		row(w, "token", s.Token)
		row(w, "holder", s.Holder)
		row(w, "held", yesNo(s.Held))
		if acquired {
			row(w, "holders", s.Holders)
		}
		row(w, "expires at", stamp(s.ExpiresAt))
		row(w, "remaining", s.Remaining().Round(time.Millisecond))
	})
}
