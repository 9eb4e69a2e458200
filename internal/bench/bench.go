package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/scratch"
	"go.opentelemetry.io/otel/metric"
)

// Config says what Run measures.
type Config struct {
	// Strategies to measure, in order. Defaults to Strategies().
	Strategies []Strategy
	// Clients lists the client counts; each strategy runs once per count.
	Clients []int
	// Duration of each run. With Pgbench it must be whole seconds.
	Duration time.Duration
	// Pgbench also runs pgbench with the same SQL after each library run.
	Pgbench bool
	// Rounds measures each strategy and client count this many times,
	// alternating the library and pgbench, and reports the median round of
	// each side, so that a burst of load elsewhere on the machine skews one
	// round, not the result. Defaults to 1.
	Rounds int
	// PgbenchPath is the pgbench binary. Defaults to "pgbench" on $PATH.
	PgbenchPath string
	// Progress, when not nil, is called as the runs advance, with a label
	// for the current run, the time done and the total time of all runs.
	Progress func(label string, done, total time.Duration)
	// MeterProvider, when not nil, is the Config.MeterProvider of the
	// pgquota clients the library runs create (`--metrics-addr`); nil
	// records nothing. Each run carries its own, so concurrent runs never
	// share one.
	MeterProvider metric.MeterProvider
}

// Server describes the server the bench ran on.
type Server struct {
	Version string `json:"version"`
	// SynchronousCommit is what every bench session ran with (set per
	// session, so commits are durable whatever the server's default).
	SynchronousCommit string `json:"synchronous_commit"`
	// Fsync is the server's fsync setting: with "off", no commit is
	// durable.
	Fsync string `json:"fsync"`
	// Database is the scratch database the bench created and dropped.
	Database string `json:"database"`
}

// Report is the outcome of Run.
type Report struct {
	Server     Server    `json:"server"`
	DurationMS int64     `json:"duration_ms"`
	Clients    []int     `json:"clients"`
	Rounds     int       `json:"rounds"`
	Results    []Result  `json:"results"`
	Scripts    []*Script `json:"pgbench_scripts"`
}

// Result is one strategy at one client count.
type Result struct {
	Strategy    string        `json:"strategy"`
	Description string        `json:"description"`
	Clients     int           `json:"clients"`
	Library     LibraryResult `json:"library"`
	// Pgbench holds pgbench's figures for the same SQL and client count,
	// with --pgbench.
	Pgbench *PgbenchResult `json:"pgbench"`
	// PgbenchStrategy names the strategy whose SQL pgbench ran, when it is
	// not this one (see Baseline).
	PgbenchStrategy string `json:"pgbench_strategy"`
	// Ratio is the library's operations per second over pgbench's: higher
	// is better, 1 is pgbench's throughput.
	Ratio float64 `json:"ratio"`
	// Rounds holds every round's throughput, in the order they ran, when
	// there was more than one; Library and Pgbench are then each side's
	// median round (by throughput).
	Rounds []Round `json:"rounds"`
}

// Round is one round's throughput of each side.
type Round struct {
	OpsPerSec  float64 `json:"ops_per_sec"`
	PgbenchTPS float64 `json:"pgbench_tps"`
}

// medianBy returns the element at the middle of xs sorted by key (the
// upper one of the two middles for an even count).
func medianBy[T any](xs []T, key func(T) float64) T {
	s := slices.Clone(xs)
	slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return s[len(s)/2]
}

// Run creates a scratch database on admin's server, measures every
// strategy at every client count, and drops the database.
func Run(ctx context.Context, admin *pgxpool.Pool, cfg Config) (_ *Report, err error) {
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = Strategies()
	}
	if len(cfg.Clients) == 0 {
		return nil, errors.New("no client counts given")
	}
	if cfg.Duration <= 0 {
		return nil, errors.New("the duration must be positive")
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 1
	}
	if cfg.Rounds < 1 {
		return nil, fmt.Errorf("rounds must be at least 1, got %d", cfg.Rounds)
	}
	var pgbenchPath string
	if cfg.Pgbench {
		secs := cfg.Duration.Seconds()
		if secs < 1 || secs != float64(int(secs)) {
			return nil, fmt.Errorf("with pgbench the duration must be whole seconds (pgbench -T), got %s", cfg.Duration)
		}
		if pgbenchPath, err = LookPgbench(cfg.PgbenchPath); err != nil {
			return nil, err
		}
	}

	rep := &Report{DurationMS: cfg.Duration.Milliseconds(), Clients: cfg.Clients, Rounds: cfg.Rounds}
	var maxConns int
	err = admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('max_connections')::int`).Scan(&rep.Server.Version, &rep.Server.Fsync, &maxConns)
	if err != nil {
		return nil, fmt.Errorf("read server settings: %w", err)
	}
	rep.Server.SynchronousCommit = sessionParams["synchronous_commit"]
	for _, n := range cfg.Clients {
		if n < 1 {
			return nil, fmt.Errorf("client counts must be at least 1, got %d", n)
		}
		// The scratch database's migrations and the admin pool need a few.
		if n > maxConns-10 {
			return nil, fmt.Errorf("%d clients need more connections than the server allows (max_connections = %d)", n, maxConns)
		}
	}

	db, err := scratch.Create(ctx, admin, "pgquota_bench")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, db.Drop(ctx)) }()
	rep.Server.Database = db.Name

	perRun := cfg.Duration
	runs := len(cfg.Strategies) * len(cfg.Clients) * cfg.Rounds
	if cfg.Pgbench {
		runs *= 2
	}
	total := time.Duration(runs) * perRun
	var done time.Duration
	progress := func(label string) func(time.Duration) {
		base := done
		return func(elapsed time.Duration) {
			if cfg.Progress != nil {
				cfg.Progress(label, base+elapsed, total)
			}
		}
	}

	for _, s := range cfg.Strategies {
		var script *Script
		if cfg.Pgbench {
			if script, err = Capture(ctx, db, pgbenchSide(s)); err != nil {
				return nil, err
			}
			rep.Scripts = append(rep.Scripts, script)
		}
		for _, n := range cfg.Clients {
			r := Result{Strategy: s.Name(), Description: s.Describe(), Clients: n}
			if base := pgbenchSide(s); cfg.Pgbench && base.Name() != s.Name() {
				r.PgbenchStrategy = base.Name()
			}
			var libs []LibraryResult
			var pgs []PgbenchResult
			for round := 1; round <= cfg.Rounds; round++ {
				label := fmt.Sprintf("%s, clients=%d", s.Name(), n)
				if cfg.Rounds > 1 {
					label += fmt.Sprintf(", round %d/%d", round, cfg.Rounds)
				}
				progress(label + " (library)")(0)
				lib, err := RunLibrary(ctx, db, s, n, cfg.Duration, progress(label+" (library)"), cfg.MeterProvider)
				if err != nil {
					return nil, fmt.Errorf("%s at %d clients: %w", s.Name(), n, err)
				}
				done += perRun
				libs = append(libs, lib)
				rd := Round{OpsPerSec: lib.OpsPerSec}
				if cfg.Pgbench {
					pg, err := runPgbench(ctx, db, pgbenchSide(s), script, n, cfg.Duration, pgbenchPath, progress(label+" (pgbench)"))
					if err != nil {
						return nil, fmt.Errorf("%s at %d clients: %w", s.Name(), n, err)
					}
					done += perRun
					pgs = append(pgs, pg)
					rd.PgbenchTPS = pg.TPS
				}
				r.Rounds = append(r.Rounds, rd)
			}
			r.Library = medianBy(libs, func(l LibraryResult) float64 { return l.OpsPerSec })
			if cfg.Pgbench {
				pg := medianBy(pgs, func(p PgbenchResult) float64 { return p.TPS })
				r.Pgbench = &pg
				if pg.TPS > 0 {
					r.Ratio = r.Library.OpsPerSec / pg.TPS
				}
			}
			if cfg.Rounds == 1 {
				r.Rounds = nil
			}
			rep.Results = append(rep.Results, r)
		}
	}
	if cfg.Progress != nil {
		cfg.Progress("done", total, total)
	}
	return rep, nil
}

// runPgbench resets the strategy's state (its Setup) and runs its script
// with pgbench, reporting progress by the clock.
func runPgbench(ctx context.Context, db *scratch.Database, s Strategy, script *Script, clients int, d time.Duration, path string, tick func(time.Duration)) (PgbenchResult, error) {
	pool, err := openPool(ctx, db, 1, nil)
	if err != nil {
		return PgbenchResult{}, err
	}
	env, err := newEnv(pool, nil)
	if err == nil {
		_, err = s.Setup(ctx, env)
	}
	pool.Close()
	if err != nil {
		return PgbenchResult{}, fmt.Errorf("%s: setup: %w", s.Name(), err)
	}
	stop := make(chan struct{})
	ticking := make(chan struct{})
	defer func() { close(stop); <-ticking }()
	go func() {
		defer close(ticking)
		start := time.Now()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				tick(min(time.Since(start), d))
			}
		}
	}()
	return RunPgbench(ctx, script, PgbenchOptions{
		Path:     path,
		Clients:  clients,
		Duration: d,
		Conn:     &db.Config(1).ConnConfig.Config,
	})
}
