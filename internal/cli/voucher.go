package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

func (a *app) voucherCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "voucher",
		Short: "Voucher campaigns: counted pools and pre-loaded codes",
	}

	var campaign, member, file string
	var total int64
	var shards int
	var claimKey quota.IdempotencyKey

	create := &cobra.Command{
		Use:   "create",
		Short: "Create a counted voucher pool of --total units, in one row or split across --shards rows",
		Long: `Create a counted voucher pool of --total units. With --shards K (2 to 1024, at
most the total), the total is split across K rows: a claim takes a unit from
a random shard with units left and moves on when one is empty or locked, so
up to K claims proceed at once, and the pool is sold out only when every
shard is empty. The total is never exceeded. Status sums the shards.`,
		Example: `  pgquota voucher create --campaign black-friday --total 100
  pgquota voucher create --campaign flash-sale --total 100000 --shards 32`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if shards < 1 {
				return usagef("--shards must be at least 1, got %d", shards)
			}
			c, err := a.voucherClient(cmd.Context())
			if err != nil {
				return err
			}
			var p voucher.Campaign
			if shards == 1 {
				p, err = c.CreateCampaign(cmd.Context(), campaign, total)
			} else {
				p, err = c.CreateShardedCampaign(cmd.Context(), campaign, total, shards)
			}
			if err != nil {
				return err
			}
			return a.printPool(p)
		},
	}
	create.Flags().StringVar(&campaign, "campaign", "", "campaign name (required)")
	create.Flags().Int64Var(&total, "total", 0, "number of units (required)")
	create.Flags().IntVar(&shards, "shards", 1, "split the total across this many rows (1: one row)")
	_ = create.MarkFlagRequired("campaign")
	_ = create.MarkFlagRequired("total")

	claim := &cobra.Command{
		Use:   "claim",
		Short: "Claim a voucher for a member: a unit of a pool, or a code (exit 3 when sold out)",
		Long: `Claim a voucher of a campaign for a member: one unit of a counted pool, or
one unclaimed code of a code campaign. A member holds at most one voucher per
campaign; claiming again prints the first claim. Exit status 3 when sold out.

With --idempotency-key the claim is recorded in the ledger, and a repeat with
the same key prints the first outcome (also a sold-out one); the key is
unique within --idempotency-scope, which defaults to the campaign.`,
		Example: `  pgquota voucher claim --campaign black-friday --member alice`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.voucherClient(cmd.Context())
			if err != nil {
				return err
			}
			cl, err := c.Claim(cmd.Context(), voucher.ClaimRequest{Campaign: campaign, Member: member, Idempotency: claimKey})
			if err != nil {
				return err
			}
			if err := a.output(cl, func(w *tabwriter.Writer) {
				row(w, "claimed", yesNo(cl.Claimed))
				if cl.Claimed && cl.Repeat {
					row(w, "repeat", "yes (the member's earlier claim)")
				}
				row(w, "campaign", cl.Campaign)
				row(w, "member", cl.Member)
				switch {
				case !cl.Claimed:
					row(w, "sold out", "yes")
				case cl.Code != "":
					row(w, "code", cl.Code)
				default:
					row(w, "unit", fmt.Sprintf("%d of %d", cl.Seq, cl.Total))
				}
				if cl.Claimed {
					row(w, "claimed at", stamp(cl.ClaimedAt))
				}
				keyedRows(w, cl.Keyed)
			}); err != nil {
				return err
			}
			if !cl.Claimed {
				return errDenied
			}
			return nil
		},
	}
	claim.Flags().StringVar(&campaign, "campaign", "", "campaign name (required)")
	claim.Flags().StringVar(&member, "member", "", "member (required)")
	keyFlags(claim, &claimKey, "the campaign")
	_ = claim.MarkFlagRequired("campaign")
	_ = claim.MarkFlagRequired("member")

	imp := &cobra.Command{
		Use:   "import",
		Short: "Load codes into a code campaign from a file, one code per line (- for stdin)",
		Long: `Load voucher codes into a code campaign, creating it if needed. The file holds
one code per line; blank lines and surrounding spaces are ignored. Codes
already in the campaign are skipped and counted. One bad line rejects the
whole file and nothing is written.`,
		Example: `  pgquota voucher import --campaign spring --file codes.txt`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			codes, lines, err := readCodes(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			c, err := a.voucherClient(cmd.Context())
			if err != nil {
				return err
			}
			res, err := c.ImportCodes(cmd.Context(), campaign, codes)
			if err != nil {
				return codeLineError(err, file, codes, lines)
			}
			return a.output(res, func(w *tabwriter.Writer) {
				row(w, "campaign", res.Campaign)
				row(w, "imported", res.Imported)
				row(w, "duplicates", res.Duplicates)
				row(w, "total", res.Total)
			})
		},
	}
	imp.Flags().StringVar(&campaign, "campaign", "", "campaign name (required)")
	imp.Flags().StringVar(&file, "file", "", "file of codes, one per line, or - for stdin (required)")
	_ = imp.MarkFlagRequired("campaign")
	_ = imp.MarkFlagRequired("file")

	status := &cobra.Command{
		Use:     "status",
		Short:   "Show a campaign's total, claimed and remaining vouchers",
		Example: `  pgquota voucher status --campaign black-friday`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.voucherClient(cmd.Context())
			if err != nil {
				return err
			}
			p, err := c.Campaign(cmd.Context(), campaign)
			if err != nil {
				return err
			}
			return a.printPool(p)
		},
	}
	status.Flags().StringVar(&campaign, "campaign", "", "campaign name (required)")
	_ = status.MarkFlagRequired("campaign")

	cmd.AddCommand(create, claim, imp, status)
	return cmd
}

func (a *app) printPool(p voucher.Campaign) error {
	return a.output(p, func(w *tabwriter.Writer) {
		row(w, "campaign", p.Name)
		row(w, "kind", p.Kind)
		if p.Shards > 0 {
			row(w, "shards", p.Shards)
		}
		row(w, "total", p.Total)
		row(w, "claimed", p.Claimed)
		row(w, "remaining", p.Remaining)
		row(w, "sold out", yesNo(p.SoldOut))
	})
}

// readCodes reads one code per line from path ("-" for stdin), and the
// line number of each code.
func readCodes(path string, stdin io.Reader) (codes []string, lines []int, err error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, usagef("--file: %v", err)
		}
		defer f.Close()
		r = f
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for line := 1; sc.Scan(); line++ {
		code := strings.TrimSpace(sc.Text())
		if code == "" {
			continue
		}
		if len(code) > quota.MaxNameBytes {
			return nil, nil, usagef("--file %s line %d: code is %d bytes long, the limit is %d", path, line, len(code), quota.MaxNameBytes)
		}
		codes = append(codes, code)
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("--file: %w", err)
	}
	if len(codes) == 0 {
		return nil, nil, usagef("--file %s holds no codes", path)
	}
	return codes, lines, nil
}

// codeLineError turns ImportCodes' "invalid code N" (the N-th code) into an
// error that names the code's line in the file.
func codeLineError(err error, path string, codes []string, lines []int) error {
	var ie *quota.InputError
	var i int
	if !errors.As(err, &ie) {
		return err
	}
	if _, scanErr := fmt.Sscanf(ie.Field, "code %d", &i); scanErr != nil || i < 1 || i > len(codes) {
		return err
	}
	return usagef("--file %s line %d: invalid code %q: %s", path, lines[i-1], codes[i-1], ie.Reason)
}

// voucherClient is the voucher client on quotaClient's pool and settings.
func (a *app) voucherClient(ctx context.Context) (*voucher.Client, error) {
	c, err := a.quotaClient(ctx)
	if err != nil {
		return nil, err
	}
	return voucher.New(c, nil)
}
