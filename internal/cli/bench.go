package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/pgquota/pgquota/internal/bench"
)

func (a *app) benchCommand() *cobra.Command {
	var (
		cfg        bench.Config
		names      []string
		chart      string
		noProgress bool
		peers      peersFlags
		metrics    string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput and latency of each check-then-act strategy, optionally beside pgbench",
		Long: `Measure each strategy's operations per second and latency (p50, p95, p99) at
each client count of --clients, for --duration per run, with durable commits
(synchronous_commit=on in every session). The library side runs N goroutines
on a pool of exactly N connections.

--pgbench also runs pgbench (-M prepared, same client count, same duration,
right after the library run) with the very statements the library sent:
they are captured with a pgx tracer and written into a pgbench script, so
the SQL is the same by construction. The output then ends with one line
"ratio <strategy>/<clients> <library ops/s / pgbench tps>" per run: higher
is better; 1.00 is pgbench's throughput, 0.90 is 90% of it.

--rounds K measures each strategy and client count K times, alternating the
library and pgbench, and prints each side's median round: on a shared
machine, a burst of load elsewhere then skews one round instead of the
ratio.

--peers measures instead, in one run, each case (grant-spread, grant-hot,
rate-spread, rate-hot, lease-cycle; --strategy picks some) through pgquota
with the default Config, through pgbench on the
same SQL, and through the Redis peers (go-redis/redis_rate, bsm/redislock)
against two redis-server processes it starts itself (no persistence, and
--appendonly yes --appendfsync always), printing ops/s, p50, p99 and the
ratios pgquota/peer (higher is better for pgquota).

The bench works in a scratch database it creates on the server (the role
needs CREATEDB) and drops afterwards. Strategies:
` + strategyList(),
		Example: `  pgquota bench --clients 1,8,32,64 --duration 5s
  pgquota bench --strategy grant-hot,grant-spread --clients 8,32 --duration 5s --pgbench
  pgquota bench --strategy lease-acquire,fenced-write --clients 8,32 --pgbench --rounds 3
  pgquota bench --clients 1,8,32 --chart bench.svg --json
  pgquota bench --peers --clients 1,8,32,64 --duration 5s --chart peers.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if peers.on {
				return a.benchPeers(ctx, cmd, &peers, cfg, names, chart, noProgress) // bench_peers.go
			}
			for _, name := range names {
				s, ok := bench.Lookup(name)
				if !ok {
					return usagef("--strategy: unknown strategy %q (known: %s)", name, strings.Join(strategyNames(), ","))
				}
				cfg.Strategies = append(cfg.Strategies, s)
			}
			if chart != "" {
				if _, err := bench.ChartFormat(chart); err != nil {
					return usagef("--chart: %v", err)
				}
			}
			if cfg.Duration <= 0 {
				return usagef("--duration must be positive, got %s", cfg.Duration)
			}
			if cfg.Pgbench {
				if s := cfg.Duration.Seconds(); s < 1 || s != float64(int(s)) {
					return usagef("--duration must be whole seconds with --pgbench (pgbench -T), got %s", cfg.Duration)
				}
			}
			for _, n := range cfg.Clients {
				if n < 1 {
					return usagef("--clients: counts must be at least 1, got %d", n)
				}
			}
			if cfg.Rounds < 1 {
				return usagef("--rounds must be at least 1, got %d", cfg.Rounds)
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
			if !a.json {
				// Before the run: it can take minutes.
				fmt.Fprintln(a.stdout, benchPlan(cfg))
			}
			if w := a.progressWriter(noProgress); w != nil {
				bar := newProgressBar(w)
				cfg.Progress = func(label string, done, total time.Duration) {
					bar.ChangeMax64(max(total.Milliseconds(), 1))
					bar.Describe(label)
					_ = bar.Set64(done.Milliseconds())
				}
				defer func() { _ = bar.Clear(); fmt.Fprint(w, "\r") }()
			}
			rep, err := bench.Run(ctx, admin, cfg)
			if err != nil {
				return err
			}
			if chart != "" {
				if err := bench.WriteChart(rep, chart); err != nil {
					return err
				}
			}
			return a.output(rep, func(w *tabwriter.Writer) { benchText(w, rep, chart) })
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&cfg.Clients, "clients", []int{1, 8, 32, 64}, "client counts to measure")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "duration of each run")
	f.StringSliceVar(&names, "strategy", nil, "strategies to measure (default all): "+strings.Join(strategyNames(), ","))
	f.BoolVar(&cfg.Pgbench, "pgbench", false, "also run pgbench with the same SQL and print the ratio")
	f.StringVar(&cfg.PgbenchPath, "pgbench-path", "pgbench", "the pgbench binary")
	f.IntVar(&cfg.Rounds, "rounds", 1, "measure each run this many times, alternating library and pgbench; print the median rounds")
	f.StringVar(&chart, "chart", "", "draw throughput against clients to FILE.svg or FILE.png")
	f.BoolVar(&noProgress, "no-progress", false, "no progress bar on stderr")
	peers.register(f)
	metricsAddrFlag(cmd, &metrics)
	return cmd
}

func strategyNames() []string {
	var names []string
	for _, s := range bench.Strategies() {
		names = append(names, s.Name())
	}
	return names
}

// strategyList lists the strategies for --help, their descriptions
// aligned after the longest name.
func strategyList() string {
	width := 0
	for _, s := range bench.Strategies() {
		width = max(width, len(s.Name()))
	}
	var sb strings.Builder
	for _, s := range bench.Strategies() {
		fmt.Fprintf(&sb, "  %-*s  %s\n", width, s.Name(), s.Describe())
	}
	return sb.String()
}

// benchPlan says how long the bench measures, before it starts: strategies
// x client counts x duration x rounds x sides (library, pgbench).
func benchPlan(cfg bench.Config) string {
	strategies := len(cfg.Strategies)
	if strategies == 0 {
		strategies = len(bench.Strategies())
	}
	sides, sideWord := 1, "library only"
	if cfg.Pgbench {
		sides, sideWord = 2, "library and pgbench"
	}
	total := time.Duration(strategies*len(cfg.Clients)*cfg.Rounds*sides) * cfg.Duration
	return fmt.Sprintf("pgquota bench: %s x %s x %s x %s x %s (%s) = %s of measuring, plus setup",
		plural(strategies, "strategy", "strategies"), plural(len(cfg.Clients), "client count", "client counts"),
		cfg.Duration, plural(cfg.Rounds, "round", "rounds"), plural(sides, "side", "sides"), sideWord, total)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// progressWriter returns stderr when a progress bar belongs there: not
// with --json, not when asked not to, and only on a terminal.
func (a *app) progressWriter(off bool) io.Writer {
	if a.json || off {
		return nil
	}
	f, ok := a.stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return f
}

func newProgressBar(w io.Writer) *progressbar.ProgressBar {
	return progressbar.NewOptions64(1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionFullWidth(),
	)
}

// benchText prints the bench's report as an aligned table, then a legend
// and, with pgbench, one ratio line per run.
func benchText(w *tabwriter.Writer, rep *bench.Report, chart string) {
	fmt.Fprintf(w, "pgquota bench: PostgreSQL %s, %s per run, synchronous_commit=%s (durable commits), fsync=%s\n",
		rep.Server.Version, time.Duration(rep.DurationMS)*time.Millisecond, rep.Server.SynchronousCommit, rep.Server.Fsync)
	fmt.Fprintf(w, "scratch database %s (dropped afterwards)\n", rep.Server.Database)
	if rep.Rounds > 1 {
		fmt.Fprintf(w, "%d rounds per run, alternating library and pgbench: the figures are each side's median round\n", rep.Rounds)
	}
	fmt.Fprintln(w)
	withPgbench := len(rep.Results) > 0 && rep.Results[0].Pgbench != nil
	head := []any{"strategy", "clients", "ops/s", "p50 ms", "p95 ms", "p99 ms", "retries", "errors"}
	if withPgbench {
		head = append(head, "pgbench/s", "pgb p50", "pgb p95", "pgb p99", "ratio")
	}
	row(w, head...)
	for _, r := range rep.Results {
		l := r.Library
		cells := []any{r.Strategy, r.Clients, fmt.Sprintf("%.0f", l.OpsPerSec),
			fmt.Sprintf("%.2f", l.P50), fmt.Sprintf("%.2f", l.P95), fmt.Sprintf("%.2f", l.P99), l.Retries, l.Errors}
		if p := r.Pgbench; p != nil {
			cells = append(cells, fmt.Sprintf("%.0f", p.TPS),
				fmt.Sprintf("%.2f", p.P50), fmt.Sprintf("%.2f", p.P95), fmt.Sprintf("%.2f", p.P99),
				ratioText(r.Ratio))
		}
		row(w, cells...)
	}
	_ = w.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ops/s: operations completed per second; p50/p95/p99: latency of one operation as its client saw it, in ms;")
	fmt.Fprintln(w, "retries: transactions the serializable strategy retried after a serialization failure (40001) or deadlock (40P01);")
	fmt.Fprintln(w, "the other strategies show 0 (pgquota's own calls retry inside the library, uncounted). errors: operations that failed.")
	if withPgbench {
		fmt.Fprintln(w, "pgbench/s and pgb p50..p99: pgbench -M prepared on the same SQL, clients and duration; ratio: ops/s / pgbench/s.")
		fmt.Fprintln(w, "A strategy measured against another one's SQL says so on its ratio line (pgbench ran ...).")
	}
	if rep.Rounds > 1 {
		fmt.Fprintln(w, "rounds (ops/s, and pgbench/s with --pgbench, in the order they ran):")
		for _, r := range rep.Results {
			var parts []string
			for _, rd := range r.Rounds {
				p := fmt.Sprintf("%.0f", rd.OpsPerSec)
				if withPgbench {
					p += fmt.Sprintf("/%.0f", rd.PgbenchTPS)
				}
				parts = append(parts, p)
			}
			fmt.Fprintf(w, "  %s/%d: %s\n", r.Strategy, r.Clients, strings.Join(parts, " "))
		}
	}
	if chart != "" {
		fmt.Fprintf(w, "chart: %s\n", chart)
	}
	for _, r := range rep.Results {
		if r.Library.FirstError != "" {
			fmt.Fprintf(w, "%s/%d: first error: %s\n", r.Strategy, r.Clients, r.Library.FirstError)
		}
		if r.Pgbench != nil && r.Pgbench.Note != "" {
			fmt.Fprintf(w, "%s/%d: %s\n", r.Strategy, r.Clients, r.Pgbench.Note)
		}
	}
	if rs := bench.RedisRatios(rep); len(rs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "pgquota's ops/s over go-redis/redis_rate's at the same client count (redis-rate: local Redis, no persistence; -durable: appendfsync always):")
		for _, l := range rs {
			fmt.Fprintln(w, l)
		}
	}
	if withPgbench {
		fmt.Fprintln(w)
		for _, r := range rep.Results {
			if r.PgbenchStrategy != "" {
				fmt.Fprintf(w, "ratio %s/%d %s (pgbench ran %s)\n", r.Strategy, r.Clients, ratioText(r.Ratio), r.PgbenchStrategy)
				continue
			}
			fmt.Fprintf(w, "ratio %s/%d %s\n", r.Strategy, r.Clients, ratioText(r.Ratio))
		}
	}
}

// ratioText prints a ratio, or "-" when pgbench measured nothing.
func ratioText(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}
