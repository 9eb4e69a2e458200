package cli

import (
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
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
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			e, err := c.LeaseEpoch(cmd.Context())
			if err != nil {
				return err
			}
			return a.printLeaseEpoch(e)
		},
	}
	var minEpoch int64
	bump := &cobra.Command{
		Use:   "bump",
		Short: "Raise the epoch of the tokens issued from now on",
		Long: `Raise the epoch of the next lease tokens by one, or to --min-epoch when that
is higher, so that every later token exceeds every token issued so far. Use it
after restoring a database whose source went on issuing tokens in later epochs
after the dump was taken, or after restoring a file-system snapshot of the same
cluster without a new timeline. Run it on the primary, and let it reach the
standbys before a failover.`,
		Example: `  pgquota lease epoch bump
  pgquota lease epoch bump --min-epoch 12`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if minEpoch < 0 || minEpoch > quota.MaxLeaseEpoch {
				return usagef("--min-epoch must be between 0 and %d", int64(quota.MaxLeaseEpoch))
			}
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			e, err := c.BumpLeaseEpoch(cmd.Context(), minEpoch)
			if err != nil {
				return err
			}
			return a.printLeaseEpoch(e)
		},
	}
	bump.Flags().Int64Var(&minEpoch, "min-epoch", 0, "raise the epoch to at least this")
	cmd.AddCommand(bump)
	return cmd
}

func (a *app) printLeaseEpoch(e quota.LeaseEpoch) error {
	return a.output(e, func(w *tabwriter.Writer) {
		row(w, "epoch", e.Epoch)
		row(w, "timeline", e.Timeline)
		row(w, "timeline offset", e.Offset)
		row(w, "recorded epoch", e.Recorded)
		row(w, "token ceiling", e.Ceiling)
	})
}
