package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota/lease"
)

// leaseEpochCommand is `pgquota lease epoch [bump]`.
func (a *app) leaseEpochCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "epoch",
		Short: "Show the epoch lease tokens are issued in (token >> 40); 'bump' raises it",
		Long: `A lease token is (epoch << 40) + n. The epoch is the server's WAL timeline
plus a recorded offset: it grows at every promotion of a standby, so tokens
issued after a failover exceed every token issued before it, also those the
standby never received. A database restored into another cluster (pg_dump and
pg_restore, pg_upgrade) moves to a higher epoch by itself.`,
		Example: `  pgquota lease epoch
  pgquota lease epoch --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			e, err := c.Epoch(cmd.Context())
			if err != nil {
				return err
			}
			return a.printLeaseEpoch(e)
		},
	}
	var (
		minEpoch    int64
		timeout     time.Duration
		standbys    int
		unconfirmed bool
		noStandbys  bool
	)
	bump := &cobra.Command{
		Use:   "bump",
		Short: "Raise the epoch of the tokens issued from now on, once every standby has it",
		Long: `Raise the epoch of the next lease tokens by one, or to --min-epoch when that
is higher, so that every later token exceeds every token issued so far. Run it
on the primary. It records the new epoch as pending, waits (up to --timeout)
until every standby the primary knows has flushed it (the walsenders of
pg_stat_replication and inactive physical replication slots; at least
--standbys of them), and only then raises it. A standby that is disconnected
and has no replication slot is invisible to the primary: name how many
standbys you run with --standbys, or state that none runs with --no-standbys;
without either, a primary that sees no standby refuses. Reading their
positions needs a superuser or pg_read_all_stats.

When a standby does not confirm, nothing is raised and it exits 1 naming the
standby. --unconfirmed raises anyway: a standby that missed the bump and is
promoted then issues tokens that can be below the old primary's last ones, and
a deposed holder's writes can land; use it only when that standby will be
rebuilt from the primary, never promoted.

Use it after restoring a base backup, file-system snapshot or dump as a cluster
of its own while the source may go on issuing tokens: read the source's epoch
with 'pgquota lease epoch' (on the source, or the highest it may have reached)
and bump the copy with --min-epoch above it.`,
		Example: `  pgquota lease epoch bump --standbys 2 --timeout 1m
  pgquota lease epoch bump --no-standbys --min-epoch 12`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if minEpoch < 0 || minEpoch > lease.MaxEpoch {
				return usagef("--min-epoch must be between 0 and %d", int64(lease.MaxEpoch))
			}
			if timeout <= 0 {
				return usagef("--timeout must be positive, got %s", timeout)
			}
			if standbys < 0 {
				return usagef("--standbys must be 0 or more, got %d", standbys)
			}
			if noStandbys && standbys > 0 {
				return usagef("--no-standbys and --standbys %d contradict each other", standbys)
			}
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			e, err := c.BumpEpoch(cmd.Context(), lease.BumpEpochRequest{
				MinEpoch: minEpoch, Timeout: timeout, Standbys: standbys, NoStandbys: noStandbys, Unconfirmed: unconfirmed})
			if err != nil {
				return err
			}
			return a.printLeaseEpoch(e)
		},
	}
	bump.Flags().Int64Var(&minEpoch, "min-epoch", 0, "raise the epoch to at least this")
	bump.Flags().DurationVar(&timeout, "timeout", lease.DefaultBumpTimeout, "how long to wait for the standbys to confirm")
	bump.Flags().IntVar(&standbys, "standbys", 0, "the number of standbys you run, that must confirm (count those the primary cannot see)")
	bump.Flags().BoolVar(&noStandbys, "no-standbys", false, "no standby runs: raise at once when the primary sees none")
	bump.Flags().BoolVar(&unconfirmed, "unconfirmed", false, "raise the epoch even when a standby has not confirmed it (a standby promoted without it issues lower tokens)")
	cmd.AddCommand(bump)
	return cmd
}

func (a *app) printLeaseEpoch(e lease.Epoch) error {
	return a.output(e, func(w *tabwriter.Writer) {
		row(w, "epoch", e.Epoch)
		row(w, "timeline", e.Timeline)
		row(w, "timeline offset", e.Offset)
		row(w, "recorded epoch", e.Recorded)
		row(w, "token ceiling", e.Ceiling)
		if e.Pending != 0 {
			row(w, "pending epoch", e.Pending)
		}
		for _, s := range e.Standbys {
			status := "confirmed"
			if !s.Confirmed {
				status = "NOT confirmed"
			}
			row(w, "standby "+s.Name, fmt.Sprintf("%s, flushed %s, %s", s.State, s.FlushedLSN, status))
		}
	})
}
