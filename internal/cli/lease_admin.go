package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota/lease"
)

// Environment variables `lease do` and `election campaign` set for the
// command they run.
const (
	envLeaseName   = "PGQUOTA_LEASE_NAME"
	envLeaseToken  = "PGQUOTA_LEASE_TOKEN"
	envLeaseHolder = "PGQUOTA_LEASE_HOLDER"
)

func (a *app) leaseDoCommand() *cobra.Command {
	var name, holder, payload string
	var ttl, killAfter time.Duration
	var wait bool
	cmd := &cobra.Command{
		Use:   "do --name NAME [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding a lease; stop it when the lease is lost",
		Long: `Acquire the lease (exit 3 when another holds it, unless --wait), run the
command with the lease's name, fencing token and holder in $` + envLeaseName + `,
$` + envLeaseToken + ` and $` + envLeaseHolder + `, renew the lease while it runs, and
release it when the command exits. Pass the token on every write the command
makes (pgquota fence write --token "$` + envLeaseToken + `" --lease NAME, or a guarded
table's token column), so that a write made after the lease was lost is
rejected where it lands.

When the lease is lost, or about to expire without a confirmed renewal (the
database is unreachable), or pgquota is interrupted, the command's process
group gets SIGTERM, and SIGKILL --kill-after later, so that it is gone before
the lease expires by the database clock. The command's stdin is /dev/null;
its stdout and stderr are pgquota's.

Exit status: 0 when the command exited 0 while the lease was held; 3 when the
lease was held by another (without --wait) or lost while the command ran; 2
usage error; 1 when the command failed (its status is on stderr) or any other
error.`,
		Example: `  pgquota lease do --name nightly-report --ttl 30s -- ./report.sh
  pgquota lease do --name nightly-report --ttl 30s --wait -- sh -c 'pgquota fence write --resource nightly-report --lease nightly-report --key status --value done --token "$PGQUOTA_LEASE_TOKEN"'`,
		Args: cobra.MinimumNArgs(1),
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
				killAfter = ttl / 20 // half of Keepalive's default margin, TTL/10
			}
			err = c.Do(cmd.Context(), lease.DoRequest{Name: name, Holder: holder, TTL: ttl, Wait: wait, Payload: payload},
				func(ctx context.Context) error { return a.runLeased(ctx, args, killAfter) })
			return a.leaseRunError(err)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&name, "name", "", "lease name (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "the lease's time to live, renewed every ttl/3 while the command runs")
	cmd.Flags().StringVar(&holder, "holder", "", "holder name shown to others (default: hostname:pid of the running command)")
	cmd.Flags().BoolVar(&wait, "wait", false, "when another holds the lease, wait until it is free (until interrupted) instead of exiting 3")
	cmd.Flags().StringVar(&payload, "payload", "", "data stored with the lease while the command runs")
	cmd.Flags().DurationVar(&killAfter, "kill-after", 0, "after SIGTERM, send SIGKILL this much later (default ttl/20)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// leaseEndedError says the lease (or leadership) ended while the command
// ran, which was then stopped.
type leaseEndedError struct{ cause error }

func (e *leaseEndedError) Error() string {
	return "the command was stopped: " + trimPrefix(e.cause.Error())
}

func (e *leaseEndedError) Unwrap() error { return e.cause }

// runLeased runs args under the lease in ctx, stopping its process group
// when ctx ends.
func (a *app) runLeased(ctx context.Context, args []string, killAfter time.Duration) error {
	l, _ := lease.FromContext(ctx)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(),
		envLeaseName+"="+l.Name, envLeaseToken+"="+strconv.FormatInt(l.Token, 10), envLeaseHolder+"="+l.Holder)
	cmd.Stdout, cmd.Stderr = a.stdout, a.stderr
	stopGroupOnCancel(cmd, killAfter) // exec_unix.go
	// Output copying ends at most this long after the kill, also when the
	// command's children keep its stdout open.
	cmd.WaitDelay = killAfter + time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return &leaseEndedError{cause: context.Cause(ctx)}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("command %s exited with status %d", args[0], ee.ExitCode())
	}
	if err != nil {
		return fmt.Errorf("run %s: %w", args[0], err)
	}
	return nil
}

// leaseRunError maps Do's outcome to the exit statuses: a lease held by
// another (printed like acquire's) or lost while the command ran is a
// denial.
func (a *app) leaseRunError(err error) error {
	var held *lease.HeldError
	var ended *leaseEndedError
	switch {
	case errors.As(err, &held):
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
	case errors.As(err, &ended) && (errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrExpiring)):
		fmt.Fprintln(a.stderr, "pgquota: "+oneLine(err.Error()))
		return errDenied
	}
	return err
}

func (a *app) leaseListCommand() *cobra.Command {
	var f lease.Filter
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List leases by name: holder, token, expiry, payload",
		Long: `List leases ordered by name, held or not (expired and released rows stay until
'pgquota lease reap' deletes them), judged by the database clock.`,
		Example: `  pgquota lease list --prefix job/ --held
  pgquota lease list --limit 100 --after job/0420 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			ls, err := c.List(cmd.Context(), f)
			if err != nil {
				return err
			}
			out := make([]leaseJSON, len(ls))
			for i, l := range ls {
				out[i] = leaseOut(l)
			}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "NAME", "TOKEN", "HOLDER", "HELD", "EXPIRES AT", "PAYLOAD")
				for _, l := range ls {
					row(w, l.Name, l.Token, l.Holder, yesNo(l.Held), stamp(l.ExpiresAt), oneLine(l.Payload))
				}
			})
		},
	}
	cmd.Flags().StringVar(&f.Prefix, "prefix", "", "only leases whose name starts with this")
	cmd.Flags().BoolVar(&f.HeldOnly, "held", false, "only leases held now")
	cmd.Flags().IntVar(&f.Limit, "limit", lease.DefaultListLimit, fmt.Sprintf("at most this many (up to %d)", lease.MaxListLimit))
	cmd.Flags().StringVar(&f.After, "after", "", "only names after this one (the last name of the previous page)")
	return cmd
}

func (a *app) leaseReapCommand() *cobra.Command {
	var req lease.ReapRequest
	cmd := &cobra.Command{
		Use:   "reap",
		Short: "Delete lease rows that expired more than --older-than ago",
		Long: `Delete lease rows that expired or were released more than --older-than ago,
by the database clock (at least 1m). Fence rows are kept, so a holder
deposed long ago still cannot write: its writes that name the lease find no
lease held with its token, and the others meet the kept highest token.

--fences also deletes each reaped lease's fence row of the same name, unless
an external token raised it, a guarded table ('pgquota fence guard') uses it,
or it was written within --older-than. Use it only when every write to those
resources names its lease (fence write without --external, or the fenced-grant comparison path): a write
checked against the fence alone, with a token older than the deleted row
held, would be admitted. Fence rows without a lease are never deleted.`,
		Example: `  pgquota lease reap --older-than 24h
  pgquota lease reap --older-than 168h --fences --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			reaped, err := c.Reap(cmd.Context(), req)
			if err != nil {
				return err
			}
			fences := 0
			for _, r := range reaped {
				if r.FenceDeleted {
					fences++
				}
			}
			if reaped == nil {
				reaped = []lease.Reaped{}
			}
			out := struct {
				Deleted       int            `json:"deleted"`
				FencesDeleted int            `json:"fences_deleted"`
				OlderThanMS   int64          `json:"older_than_ms"`
				Leases        []lease.Reaped `json:"leases"`
			}{len(reaped), fences, req.OlderThan.Milliseconds(), reaped}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "deleted", len(reaped))
				row(w, "fences deleted", fences)
				row(w, "older than", req.OlderThan)
			})
		},
	}
	cmd.Flags().DurationVar(&req.OlderThan, "older-than", 0, "delete leases expired longer ago than this, e.g. 24h (required, at least 1m)")
	cmd.Flags().BoolVar(&req.Fences, "fences", false, "also delete the reaped leases' own fence rows (see above)")
	cmd.Flags().IntVar(&req.Limit, "limit", 0, "delete at most this many lease rows (0: all that qualify)")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

func (a *app) leasePayloadCommand() *cobra.Command {
	var name, payload string
	var token int64
	cmd := &cobra.Command{
		Use:     "set-payload",
		Short:   "Replace the payload of a lease held with --token (exit 3 when it was lost)",
		Example: `  pgquota lease set-payload --name nightly-report --token 42 --payload 'step 2 of 3'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.leaseClient(cmd.Context())
			if err != nil {
				return err
			}
			l, err := c.SetPayload(cmd.Context(), lease.Lease{Name: name, Token: token}, payload)
			if err != nil {
				return a.leaseLost(err)
			}
			return a.printLease(l, false)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "lease name (required)")
	cmd.Flags().Int64Var(&token, "token", 0, "the lease's fencing token (required)")
	cmd.Flags().StringVar(&payload, "payload", "", "the new payload (empty clears it)")
	_ = cmd.MarkFlagRequired("name")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}
