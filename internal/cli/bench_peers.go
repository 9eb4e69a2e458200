package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgquota/pgquota/internal/bench"
)

// peersFlags are bench's --peers options.
type peersFlags struct {
	on bool
}

func (p *peersFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&p.on, "peers", false, "measure grant-spread, grant-hot, rate-spread, rate-hot and lease-cycle through pgquota (default Config), pgbench and the Redis peers (redis_rate, redislock) on a Redis started twice (no persistence; appendfsync always)")
}

func (a *app) benchPeers(ctx context.Context, _ *cobra.Command, p *peersFlags, cfg bench.Config, cases []string, chart string, noProgress bool) error {
	if s := cfg.Duration.Seconds(); s < 1 || s != float64(int(s)) {
		return usagef("--duration must be whole seconds with --peers (pgbench -T), got %s", cfg.Duration)
	}
	for _, n := range cfg.Clients {
		if n < 1 {
			return usagef("--clients: counts must be at least 1, got %d", n)
		}
	}
	known := map[string]bool{}
	for _, c := range bench.PeerCases() {
		known[c.Name] = true
	}
	for _, c := range cases {
		if !known[c] {
			return usagef("--strategy with --peers: unknown case %q (known: grant-spread,grant-hot,rate-spread,rate-hot,lease-cycle)", c)
		}
	}
	if chart != "" {
		if _, err := bench.ChartFormat(chart); err != nil {
			return usagef("--chart: %v", err)
		}
	}
	admin, err := a.connect(ctx)
	if err != nil {
		return err
	}
	ncases := len(cases)
	if ncases == 0 {
		ncases = len(bench.PeerCases())
	}
	runs := ncases * len(cfg.Clients) * len(bench.PeerSides)
	if !a.json {
		fmt.Fprintf(a.stdout, "peers: %d cases x %d client counts x %d sides x %s = about %s\n",
			ncases, len(cfg.Clients), len(bench.PeerSides), cfg.Duration, (time.Duration(runs) * cfg.Duration).Round(time.Second))
	}
	pc := bench.PeersConfig{Clients: cfg.Clients, Duration: cfg.Duration, PgbenchPath: cfg.PgbenchPath, Cases: cases, MeterProvider: a.meterProvider}
	if w := a.progressWriter(noProgress); w != nil {
		pc.Progress = func(label string) { fmt.Fprintf(w, "\r\033[K%s", label) }
		defer fmt.Fprint(w, "\r\033[K")
	}
	rep, err := bench.RunPeers(ctx, admin, pc)
	if err != nil {
		return err
	}
	if chart != "" {
		if err := bench.WritePeersChart(rep, chart); err != nil {
			return err
		}
	}
	return a.output(rep, func(w *tabwriter.Writer) { peersText(w, rep, chart) })
}

func peersText(w *tabwriter.Writer, rep *bench.PeersReport, chart string) {
	fmt.Fprintf(w, "PostgreSQL %s (synchronous_commit=%s, fsync=%s), Redis %s; %s per run, one run each\n",
		rep.Server.Version, rep.Server.SynchronousCommit, rep.Server.Fsync, rep.Redis, time.Duration(rep.DurationMS)*time.Millisecond)
	fmt.Fprintln(w, "case\tclients\tside\tops/s\tp50 ms\tp99 ms\terrors\t")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%s\t%d\t%s\t%.0f\t%.2f\t%.2f\t%d\t\n", r.Case, r.Clients, r.Side, r.OpsPerSec, r.P50, r.P99, r.Errors)
	}
	w.Flush()
	fmt.Fprintln(w, "ratios, higher is better for pgquota: pgquota ops/s / the side's ops/s")
	fmt.Fprintln(w, "case\tclients\t/pgbench\t/redis\t/redis-aof\t")
	for _, c := range rep.Cases {
		for _, n := range rep.Clients {
			fmt.Fprintf(w, "%s\t%d\t%.2f\t%.2f\t%.2f\t\n", c.Name, n,
				rep.Ratio(c.Name, "pgbench", n), rep.Ratio(c.Name, "redis", n), rep.Ratio(c.Name, "redis-aof", n))
		}
	}
	w.Flush()
	for _, r := range rep.Results {
		if r.Note != "" {
			fmt.Fprintf(w, "note %s/%d %s: %s\n", r.Case, r.Clients, r.Side, r.Note)
		}
	}
	if chart != "" {
		fmt.Fprintf(w, "chart: %s\n", chart)
	}
}
