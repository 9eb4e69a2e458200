package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota/lease"
)

func (a *app) leaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Leases that issue fencing tokens: acquire, renew, release, show, do, list, reap",
		Long: `A lease is held by one holder at a time until it expires by the database
clock. Each acquisition gets a fencing token, larger than every token issued
before it; pass it to 'pgquota fence write' (or store it in a guarded table)
so that a holder that lost its lease cannot overwrite its successor's work.`,
	}
	var name, holder, payload string
	var ttl time.Duration
	var token int64
	var wait bool

	acquire := &cobra.Command{
		Use:   "acquire",
		Short: "Acquire a lease and print its fencing token (exit 3 when held by another)",
		Example: `  pgquota lease acquire --name nightly-report --ttl 30s
  pgquota lease acquire --name nightly-report --ttl 30s --wait --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			if holder == "" {
				holder = defaultHolder()
			}
			req := lease.AcquireRequest{Name: name, Holder: holder, TTL: ttl, Payload: payload}
			var l lease.Lease
			if wait {
				l, err = c.AcquireWait(cmd.Context(), req, nil)
			} else {
				l, err = c.Acquire(cmd.Context(), req)
			}
			var held *lease.HeldError
			if errors.As(err, &held) {
				fmt.Fprintln(a.stderr, "pgquota: "+trimPrefix(held.Error()))
				if err := a.output(map[string]any{
					"acquired": false, "name": held.Name, "holder": held.Holder, "expires_at": held.ExpiresAt,
				}, func(w *tabwriter.Writer) {
					row(w, "acquired", "no")
					row(w, "name", held.Name)
					row(w, "holder", held.Holder)
					row(w, "expires at", stamp(held.ExpiresAt))
				}); err != nil {
					return err
				}
				return errDenied
			}
			if err != nil {
				return err
			}
			return a.printLease(l, true)
		},
	}
	acquire.Flags().StringVar(&name, "name", "", "lease name (required)")
	acquire.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "how long the lease lasts unless renewed")
	acquire.Flags().StringVar(&holder, "holder", "", "holder name shown to others (default: hostname:pid of the running command)")
	acquire.Flags().BoolVar(&wait, "wait", false, "when another holds the lease, wait until it is free (until interrupted) instead of exiting 3")
	acquire.Flags().StringVar(&payload, "payload", "", "data stored with this acquisition, shown by show and list")
	_ = acquire.MarkFlagRequired("name")

	renew := &cobra.Command{
		Use:     "renew",
		Short:   "Extend a lease held with --token (exit 3 when it was lost)",
		Example: `  pgquota lease renew --name nightly-report --token 42 --ttl 30s`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			l, err := c.Renew(cmd.Context(), lease.Lease{Name: name, Token: token}, ttl)
			if err != nil {
				return a.leaseLost(err)
			}
			return a.printLease(l, false)
		},
	}
	renew.Flags().StringVar(&name, "name", "", "lease name (required)")
	renew.Flags().Int64Var(&token, "token", 0, "the lease's fencing token (required)")
	renew.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "new time to live, from now")
	_ = renew.MarkFlagRequired("name")
	_ = renew.MarkFlagRequired("token")

	release := &cobra.Command{
		Use:     "release",
		Short:   "Release a lease held with --token (exit 3 when it was lost)",
		Example: `  pgquota lease release --name nightly-report --token 42`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			l, err := c.Release(cmd.Context(), lease.Lease{Name: name, Token: token})
			if err != nil {
				return a.leaseLost(err)
			}
			return a.printLease(l, false)
		},
	}
	release.Flags().StringVar(&name, "name", "", "lease name (required)")
	release.Flags().Int64Var(&token, "token", 0, "the lease's fencing token (required)")
	_ = release.MarkFlagRequired("name")
	_ = release.MarkFlagRequired("token")

	show := &cobra.Command{
		Use:     "show",
		Short:   "Show a lease: holder, token, expiry, and whether it is held",
		Example: `  pgquota lease show --name nightly-report`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			l, err := c.Get(cmd.Context(), name)
			if err != nil {
				return err
			}
			return a.printLease(l, false)
		},
	}
	show.Flags().StringVar(&name, "name", "", "lease name (required)")
	_ = show.MarkFlagRequired("name")

	cmd.AddCommand(acquire, renew, release, show, a.leaseEpochCommand(),
		a.leaseDoCommand(), a.leaseListCommand(), a.leaseReapCommand(), a.leasePayloadCommand()) // lease_admin.go
	return cmd
}

// leaseLost prints a lost lease's error and exits with ExitDenied; other
// errors pass through.
func (a *app) leaseLost(err error) error {
	if errors.Is(err, lease.ErrLost) {
		fmt.Fprintln(a.stderr, "pgquota: "+oneLine(trimPrefix(err.Error())))
		return errDenied
	}
	return err
}

func (a *app) printLease(l lease.Lease, acquired bool) error {
	out := struct {
		leaseJSON
		Acquired bool `json:"acquired"`
	}{leaseOut(l), acquired}
	return a.output(out, func(w *tabwriter.Writer) {
		if acquired {
			row(w, "acquired", "yes")
		}
		row(w, "name", l.Name)
		row(w, "token", l.Token)
		row(w, "holder", l.Holder)
		row(w, "held", yesNo(l.Held))
		row(w, "acquired at", stamp(l.AcquiredAt))
		row(w, "expires at", stamp(l.ExpiresAt))
		row(w, "remaining", l.Remaining().Round(time.Millisecond))
		if l.Payload != "" {
			row(w, "payload", l.Payload)
		}
	})
}

// defaultHolder names this process: host:pid (lease.DefaultHolder, the
// library's default for an empty holder).
func defaultHolder() string { return lease.DefaultHolder() }

func trimPrefix(s string) string {
	const p = "pgquota: "
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
