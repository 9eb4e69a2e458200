package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota/lease"
)

func (a *app) electionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "election",
		Short: "Leader election on a lease: campaign, leader, resign",
		Long: `The leader is whoever holds the election's lease; its fencing token is the
leader's token, and its value (the lease's payload) tells followers where
the leader is. A leader that stops renewing (a crash, a pause past --ttl)
loses leadership, and its writes fenced with its token are rejected.`,
	}
	cmd.AddCommand(a.electionCampaignCommand(), a.electionLeaderCommand(), a.electionResignCommand())
	return cmd
}

func (a *app) electionCampaignCommand() *cobra.Command {
	var name, holder, value string
	var ttl, killAfter time.Duration
	cmd := &cobra.Command{
		Use:   "campaign --name NAME [flags] [-- COMMAND [ARG...]]",
		Short: "Wait until leader, then stay leader until interrupted or until COMMAND exits",
		Long: `Wait until this process is the leader, then print the leadership lease and
keep it alive. Without a command, stay leader until interrupted (SIGINT,
SIGTERM), then resign: the next campaigner takes over at once. With a command,
run it as leader, as 'pgquota lease do' does (the token in $` + envLeaseToken + `),
and resign when it exits.

Exit status: 0 after resigning (interrupted, or the command exited 0); 3 when
leadership was lost (the lease expired or was taken over; a command is
stopped); 2 usage error; 1 when the command failed or any other error.`,
		Example: `  pgquota election campaign --name scheduler --ttl 10s --value "$(hostname):8080"
  pgquota election campaign --name scheduler --ttl 10s -- ./run-scheduler`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			if holder == "" {
				holder = defaultHolder()
			}
			if killAfter < 0 {
				return usagef("invalid --kill-after: must not be negative, got %s", killAfter)
			}
			if killAfter == 0 {
				killAfter = ttl / 20
			}
			if len(args) > 0 {
				err := c.Do(cmd.Context(), lease.DoRequest{Name: name, Holder: holder, TTL: ttl, Wait: true, Payload: value},
					func(ctx context.Context) error {
						l, _ := lease.FromContext(ctx)
						if err := a.printLease(l, true); err != nil {
							return err
						}
						return a.runLeased(ctx, args, killAfter)
					})
				return a.leaseRunError(err)
			}
			e, err := c.NewElection(name, lease.ElectionOptions{Holder: holder, TTL: ttl})
			if err != nil {
				return err
			}
			lead, err := e.Campaign(cmd.Context(), value)
			if err != nil {
				return err
			}
			if err := a.printLease(lead.Lease(), true); err != nil {
				_ = lead.Resign(context.WithoutCancel(cmd.Context()))
				return err
			}
			select {
			case <-lead.Context().Done():
			case <-cmd.Context().Done(): // interrupted: resign
			}
			cause := context.Cause(lead.Context())
			if err := lead.Resign(context.WithoutCancel(cmd.Context())); err != nil {
				return err
			}
			if errors.Is(cause, lease.ErrLost) || errors.Is(cause, lease.ErrExpiring) {
				fmt.Fprintln(a.stderr, "pgquota: leadership lost: "+oneLine(trimPrefix(cause.Error())))
				return errDenied
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&name, "name", "", "election (lease) name (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Second, "the leadership lease's time to live: a leader that stops renewing loses leadership this long after")
	cmd.Flags().StringVar(&holder, "holder", "", "campaigner name shown to others (default: hostname:pid of the running command)")
	cmd.Flags().StringVar(&value, "value", "", "the leader's value (the lease's payload), e.g. its address")
	cmd.Flags().DurationVar(&killAfter, "kill-after", 0, "with a command: after SIGTERM, send SIGKILL this much later (default ttl/20)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

func (a *app) electionLeaderCommand() *cobra.Command {
	var name string
	var watch bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "leader",
		Short: "Show the current leader and its token (exit 3 when there is none); --watch follows changes",
		Long: `Show the election's current leader: holder, fencing token, value, expiry, in
one read. Exit 3 when nobody leads. With --watch, poll every --interval and
print the lease each time the leader changes (one JSON object per line with
--json; held false means no leader), until interrupted; exit 0.`,
		Example: `  pgquota election leader --name scheduler
  pgquota election leader --name scheduler --watch --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			if watch && interval <= 0 {
				return usagef("invalid --interval: must be positive, got %s", interval)
			}
			e, err := c.NewElection(name, lease.ElectionOptions{TTL: time.Second})
			if err != nil {
				return err
			}
			if watch {
				for l := range e.Observe(cmd.Context(), interval) {
					if err := a.printLeaderLine(l); err != nil {
						return err
					}
				}
				return nil
			}
			l, err := e.Leader(cmd.Context())
			if errors.Is(err, lease.ErrNoLeader) {
				fmt.Fprintf(a.stderr, "pgquota: election %q has no leader\n", name)
				if err := a.output(map[string]any{"name": name, "held": false}, func(w *tabwriter.Writer) {
					row(w, "name", name)
					row(w, "leader", "none")
				}); err != nil {
					return err
				}
				return errDenied
			}
			if err != nil {
				return err
			}
			return a.printLease(l, false)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "election (lease) name (required)")
	cmd.Flags().BoolVar(&watch, "watch", false, "print every change of leader until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "with --watch, how often to look")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// printLeaderLine prints one observed state of an election on one line.
func (a *app) printLeaderLine(l lease.Lease) error {
	if a.json {
		b, err := jsonValue(l, "")
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(b)
		return err
	}
	leader := "none"
	if l.Held {
		leader = l.Holder
	}
	_, err := fmt.Fprintf(a.stdout, "%s leader=%s token=%d value=%q expires=%s\n",
		stamp(l.DBNow), leader, l.Token, l.Payload, stamp(l.ExpiresAt))
	return err
}

func (a *app) electionResignCommand() *cobra.Command {
	var name string
	var token int64
	cmd := &cobra.Command{
		Use:     "resign",
		Short:   "Give up leadership held with --token (exit 3 when it was lost already)",
		Example: `  pgquota election resign --name scheduler --token 42`,
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
	cmd.Flags().StringVar(&name, "name", "", "election (lease) name (required)")
	cmd.Flags().Int64Var(&token, "token", 0, "the leader's fencing token (required)")
	_ = cmd.MarkFlagRequired("name")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}
