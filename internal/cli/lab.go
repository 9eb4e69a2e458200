package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/internal/lab"
)

func (a *app) labCommand() *cobra.Command {
	cfg := lab.DefaultConfig()
	var metrics string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Race concurrent requests against a limit with broken and safe strategies, and count the leaks",
		Long: `Race --requests concurrent requests, each on its own connection, against a
limit of --limit, once per strategy, and count what each strategy handed out:

  no-lock           read the counter, think, write read+1            (what not to do)
  naive-lock        TTL lock row in PostgreSQL, checked once, no token (what not to do)
  redis-lock        the same lock with Redis SET NX PX                (what not to do)
  redis-naive       the article's Redis lock: GET, then SET (not atomic) (what not to do)
  redlock           Redlock on 5 redis-servers, a partition and a restart (what not to do)
  conditional       pgquota's one-statement conditional grant
  fenced            pgquota lease + fenced write carrying the lease's token
  redlock-fenced    the same Redlock failure, writes fenced by pgquota tokens
  zookeeper         ZooKeeper lock recipe, no token           (what not to do)
  zookeeper-fenced  the same, sequence number as an external token
  etcd              etcd concurrency.Mutex on a lease, no token (what not to do)
  etcd-fenced       the same, create revision as an external token

Faults are injected so that the failure shows: a think time between read and
write, and a pause past the lock's TTL right before the write (after the
naive locks' freshness check). fenced gets the same lease TTL, think time and
pauses; the storage rejects its stale writes ("stale rejected"), and the
request starts over with a new lease. The output says what was injected.

The lab works in a scratch database it creates on the server (the role needs
CREATEDB) and drops afterwards unless --keep. redis-lock is reported
unavailable when no Redis answers at --redis-url. redis-naive, redlock and
redlock-fenced start their own redis-server processes (--redis-server) on
loopback ports and stop them by process id; they are reported unavailable,
with the server's log tail, when one cannot start. The "two holders" column
counts the moments in which two or more requests believed they held the
lock at once; "article" is the background article's figure, where it
reported one. The zookeeper and etcd
strategies start their own server for the run (Debian's zookeeper and
etcd-server packages) on loopback ports, with their session timeout and lease
TTL at least 500ms and 1s and their pauses scaled to match; they are reported
unavailable, with the reason, when it cannot start.

Exit status 0 when the safe strategies granted exactly the limit in every
run, 1 otherwise.`,
		Example: `  pgquota lab
  pgquota lab --runs 5
  pgquota lab --requests 50 --limit 3 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := cfg.Validate(); err != nil {
				return usagef("%v", err)
			}
			ms, err := a.startMetrics(metrics)
			if err != nil {
				return err
			}
			defer ms.stop()
			cfg.MeterProvider = a.meterProvider
			admin, err := a.connect(ctx)
			if err != nil {
				return err
			}
			ms.readyPing(admin)
			rep, err := lab.Run(ctx, admin, cfg)
			if err != nil {
				return err
			}
			if err := a.output(rep, func(w *tabwriter.Writer) {
				labText(w, rep)
				if rep.Kept {
					conn := &admin.Config().ConnConfig.Config
					fmt.Fprintf(w, "\nkept scratch database %s (--keep):\n  connect: psql '%s'\n  drop:    psql '%s' -c 'DROP DATABASE %s'\n",
						rep.Database, urlFor(conn, rep.Database), urlFor(conn, conn.Database), rep.Database)
				}
			}); err != nil {
				return err
			}
			if len(rep.Violations) > 0 {
				return errors.New("the limit did not hold: " + strings.Join(rep.Violations, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Requests, "requests", cfg.Requests, "concurrent requests, each on its own connection")
	f.Int64Var(&cfg.Limit, "limit", cfg.Limit, "units that may be handed out")
	f.DurationVar(&cfg.Think, "think", cfg.Think, "work between reading the counter and writing it")
	f.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "time to live of the locks (naive locks and fenced's lease)")
	f.DurationVar(&cfg.Pause, "pause", cfg.Pause, "pause injected right before the write, after the naive locks' freshness check (0: none)")
	f.IntVar(&cfg.Paused, "paused", cfg.Paused, "how many requests pause (the first to reach the pause)")
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "repeat the experiment; prints min/median/max")
	f.StringVar(&cfg.RedisURL, "redis-url", cfg.RedisURL, "Redis server for redis-lock")
	f.StringVar(&cfg.RedisServer, "redis-server", cfg.RedisServer, "redis-server binary that redis-naive, redlock and redlock-fenced start (default $PGQUOTA_REDIS_SERVER, else redis-server in PATH)")
	f.StringSliceVar(&cfg.Strategies, "strategy", nil, "strategies to run (default all): "+strings.Join(lab.Names(), ","))
	f.BoolVar(&cfg.Keep, "keep", false, "keep the scratch database instead of dropping it (the output says how to connect to it and drop it)")
	metricsAddrFlag(cmd, &metrics)
	return cmd
}

// labText prints the lab's report as aligned text.
func labText(w *tabwriter.Writer, rep *lab.Report) {
	runs := "1 run"
	if rep.Runs > 1 {
		runs = fmt.Sprintf("%d runs, figures are min/median/max", rep.Runs)
	}
	fmt.Fprintf(w, "pgquota lab: %d concurrent requests, each on its own connection, against a limit of %d (%s)\n",
		rep.Requests, rep.Limit, runs)
	kept := "dropped afterwards"
	if rep.Kept {
		kept = "kept (--keep)"
	}
	fmt.Fprintf(w, "PostgreSQL %s, scratch database %s (%s), synchronous_commit=%s\n\n", rep.Server, rep.Database, kept, rep.SynchronousCommit)
	fmt.Fprintln(w, "injected:")
	for _, s := range rep.Strategies {
		fmt.Fprintf(w, "  %s\t%s\n", s.Name, s.Injected)
	}
	fmt.Fprintln(w)
	row(w, "strategy", "granted", "leaked", "stale rejected", "two holders", "counter", "wall ms", "result", "article")
	for _, s := range rep.Strategies {
		article := s.Article
		if article == "" {
			article = "-"
		}
		if s.Status == lab.StatusUnavailable {
			row(w, s.Name, "-", "-", "-", "-", "-", "-", firstLine(s.Reason), article)
			continue
		}
		m := s.Summary
		row(w, s.Name, stat(m.Granted, rep.Runs, 0), stat(m.Leaked, rep.Runs, 0), stat(m.StaleRejected, rep.Runs, 0),
			twoHolders(s, rep.Runs), stat(m.Counter, rep.Runs, 0), stat(m.WallMS, rep.Runs, 0), labVerdict(s, rep.Runs), article)
	}
	fmt.Fprintf(w, "\n%s\n", rep.ArticleNote)
	for _, s := range rep.Strategies {
		if s.Status == lab.StatusUnavailable && strings.Contains(s.Reason, "\n") {
			fmt.Fprintf(w, "\n%s unavailable: %s\n", s.Name, s.Reason)
		}
		for i, r := range s.Runs {
			if r.Fault != "" {
				fmt.Fprintf(w, "\n%s run %d, fault: %s\n", s.Name, i+1, r.Fault)
			}
			if r.Errors > 0 {
				fmt.Fprintf(w, "\n%s run %d: %d requests failed, first: %s\n", s.Name, i+1, r.Errors, r.FirstError)
			}
		}
	}
}

// twoHolders prints the moments with two holders, "-" for a strategy that
// measures no holds.
func twoHolders(s lab.StrategyReport, runs int) string {
	for _, r := range s.Runs {
		if r.Holds > 0 {
			return stat(s.Summary.TwoHolders, runs, 0)
		}
	}
	return "-"
}

// firstLine is s up to its first newline (a log tail follows below the
// table).
func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// stat prints a figure: its value for one run, min/median/max for more.
func stat(s lab.Stat, runs, decimals int) string {
	f := func(v float64) string { return fmt.Sprintf("%.*f", decimals, v) }
	if runs == 1 {
		return f(s.Median)
	}
	return f(s.Min) + "/" + f(s.Median) + "/" + f(s.Max)
}

func labVerdict(s lab.StrategyReport, runs int) string {
	of := ""
	if runs > 1 {
		of = fmt.Sprintf(" in %d of %d runs", s.LeakedRuns, runs)
	}
	switch {
	case !s.Safe && s.LeakedRuns > 0:
		return "LEAKED" + of + " (what not to do)"
	case !s.Safe:
		return "did not leak this time (still broken: what not to do)"
	case s.ExactRuns == runs:
		if runs > 1 {
			return fmt.Sprintf("exact in %d of %d runs", runs, runs)
		}
		return "exact"
	default:
		return fmt.Sprintf("LIMIT BROKEN in %d of %d runs", runs-s.ExactRuns, runs)
	}
}
