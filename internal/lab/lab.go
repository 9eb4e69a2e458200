// Package lab races concurrent requests against a limit with several
// strategies, on a scratch database, and counts what each one handed out:
// the experiment of `pgquota lab`.
//
// The strategies that leak (no-lock, naive-lock, redis-lock, in broken.go)
// are here to show what not to do. Nothing in package quota depends on
// them. The safe ones are pgquota's conditional grant (conditional.go) and
// its lease with a fenced write (fenced.go), which meets the naive locks'
// think time and pauses.
package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/scratch"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"go.opentelemetry.io/otel/metric"
)

// Config says how to run the lab. Start from DefaultConfig.
type Config struct {
	// Requests is the number of concurrent requests, each on its own
	// connection.
	Requests int
	// Limit is how many units may be handed out.
	Limit int64
	// Think is the work a request does between reading the counter and
	// writing it.
	Think time.Duration
	// TTL is the locks' time to live: the naive locks' and the fenced
	// strategy's lease.
	TTL time.Duration
	// Pause is the stop-the-world pause injected into the first Paused
	// requests that reach their write (after the naive locks' freshness
	// check, right before the write); 0 injects none.
	Pause time.Duration
	// Paused is how many requests pause.
	Paused int
	// Runs repeats the experiment.
	Runs int
	// RedisURL is the Redis server of redis-lock.
	RedisURL string
	// RedisServer is the redis-server binary that redis-naive, redlock and
	// redlock-fenced start their own servers with (a name looked up in
	// PATH, or a path). Defaults to $PGQUOTA_REDIS_SERVER, else
	// redis-server in PATH (internal/svcproc).
	RedisServer string
	// Strategies to run, by name, in the order of Strategies(). Empty
	// means all.
	Strategies []string
	// Keep keeps the scratch database instead of dropping it.
	Keep bool
	// MeterProvider, when not nil, is the Config.MeterProvider of every
	// pgquota client the run creates (`pgquota lab --metrics-addr`); nil
	// records nothing. Each Run carries its own, so concurrent runs never
	// share one.
	MeterProvider metric.MeterProvider
}

// DefaultConfig returns the lab's defaults: 20 requests against a limit
// of 1, 50ms think time, locks with a 100ms TTL, and the first 3 writers
// paused 200ms. With a 100ms TTL, lock holders follow each other about
// every 100ms, so the paused writers that read the counter before the
// first write lands (at about 50+200ms) are the first three: the naive
// locks leak in every run, typically 2 units, while the timing keeps
// tens of milliseconds of margin on a loaded machine. The fenced strategy
// meets the same pauses: its first three lease holders wake after their
// lease ended, and their writes are rejected.
func DefaultConfig() Config {
	return Config{
		Requests: 20,
		Limit:    1,
		Think:    50 * time.Millisecond,
		TTL:      100 * time.Millisecond,
		Pause:    200 * time.Millisecond,
		Paused:   3,
		Runs:     1,
		RedisURL: "redis://127.0.0.1:6379",
	}
}

// Validate checks a Config; the error names the field.
func (c Config) Validate() error {
	switch {
	case c.Requests < 1 || c.Requests > 1000:
		return fmt.Errorf("requests must be between 1 and 1000, got %d", c.Requests)
	case c.Limit < 0 || c.Limit > quota.MaxUnits:
		return fmt.Errorf("limit must be between 0 and %d, got %d", quota.MaxUnits, c.Limit)
	case c.Think < 0:
		return fmt.Errorf("think must not be negative, got %s", c.Think)
	case c.TTL < time.Millisecond:
		return fmt.Errorf("ttl must be at least 1ms, got %s", c.TTL)
	case c.Pause < 0:
		return fmt.Errorf("pause must not be negative, got %s", c.Pause)
	case c.Paused < 0:
		return fmt.Errorf("paused must not be negative, got %d", c.Paused)
	case c.Runs < 1 || c.Runs > 1000:
		return fmt.Errorf("runs must be between 1 and 1000, got %d", c.Runs)
	}
	for _, name := range c.Strategies {
		if !slices.Contains(Names(), name) {
			return fmt.Errorf("unknown strategy %q (known: %v)", name, Names())
		}
	}
	return nil
}

// Strategy is one way of handing out units under a limit.
type Strategy interface {
	// Name is the strategy's short name.
	Name() string
	// Safe reports whether the strategy is meant to hold the limit; the
	// lab fails when a safe strategy leaks.
	Safe() bool
	// Injected says in a few words what a request does and which faults
	// it meets, for the output.
	Injected(cfg Config) string
	// Prepare readies the strategy once per lab. An error wrapping
	// ErrUnavailable reports the strategy unavailable, not failed.
	Prepare(ctx context.Context, env *Env) error
	// Reset brings its state back to nothing handed out, before a run.
	Reset(ctx context.Context, env *Env) error
	// Request is one client's attempt to get a unit.
	Request(ctx context.Context, env *Env, c *Client) (Outcome, error)
	// Counter reads what the database says was handed out.
	Counter(ctx context.Context, env *Env) (int64, error)
	// Close releases what Prepare took.
	Close(ctx context.Context, env *Env) error
}

// ErrUnavailable marks a strategy that cannot run here (no Redis).
var ErrUnavailable = errors.New("unavailable")

// Outcome is the result of one request.
type Outcome struct {
	// Granted reports that the request believes it got a unit.
	Granted bool
	// StaleRejected reports that the storage refused its write as stale.
	StaleRejected bool
	// Holds are the spans during which the request believed it held the
	// lock, for strategies that measure them (holders.go).
	Holds []Hold
	// Fault says what the strategy injected while serving this request
	// (the redlock strategies' instance restart), for the output.
	Fault string
}

// Env is what the strategies run against.
type Env struct {
	Config Config
	// DB is a small pool on the scratch database for setup and counting.
	DB *pgxpool.Pool
	// Quota is pgquota's client on DB; Leases and Fences its lease and
	// fence clients.
	Quota  *quota.Client
	Leases *lease.Client
	Fences *fence.Client
	// Faults injects the pauses of the current run.
	Faults *Faults
	// Database names the scratch database.
	Database string
	// Run numbers the current run from 1.
	Run int
}

// Client is one request's own connection.
type Client struct {
	// ID numbers the client from 1.
	ID int
	// Pool holds exactly one connection.
	Pool *pgxpool.Pool
	// Quota is pgquota's client on Pool; Leases and Fences its lease and
	// fence clients.
	Quota  *quota.Client
	Leases *lease.Client
	Fences *fence.Client
}

// Faults injects the lab's pauses: the first Paused requests that call
// Pause sleep for the configured time.
type Faults struct {
	n      atomic.Int64
	paused int64
	pause  time.Duration
}

// Pause sleeps for the configured pause if the caller is one of the first
// requests to get here, and reports whether it did.
func (f *Faults) Pause(ctx context.Context) bool {
	if f.n.Add(1) > f.paused {
		return false
	}
	sleep(ctx, f.pause)
	return true
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// retryEvery is how often a request that did not get a lock tries again
// (plus up to half as much again at random).
const retryEvery = 20 * time.Millisecond

// giveUpAt is when a request stops waiting for a lock that never comes
// free: every holder keeps a lock at most a TTL.
func giveUpAt(cfg Config) time.Time {
	return time.Now().Add(time.Duration(cfg.Requests+2)*(cfg.TTL+cfg.Think+retryEvery) + 5*time.Second)
}

// strategies makes the lab's strategies, in order. Each Run gets instances
// of its own, so concurrent labs share no state (redis-lock keeps its
// client between Prepare and Close).
var strategies = []func() Strategy{
	func() Strategy { return noLock{} },
	func() Strategy { return &naiveLock{} },
	func() Strategy { return &redisLock{} },
	func() Strategy { return &redisNaive{} },
	func() Strategy { return &redlock{} },
	func() Strategy { return conditional{} },
	func() Strategy { return fenced{} },
	func() Strategy { return &redlock{fenced: true} },
	func() Strategy { return &zookeeperLock{} },
	func() Strategy { return &zookeeperLock{fenced: true} },
	func() Strategy { return &etcdLock{} },
	func() Strategy { return &etcdLock{fenced: true} },
}

// Strategies returns new instances of the lab's strategies, in order.
func Strategies() []Strategy {
	out := make([]Strategy, len(strategies))
	for i, newStrategy := range strategies {
		out[i] = newStrategy()
	}
	return out
}

// Names lists the strategies' names, in order.
func Names() []string {
	var names []string
	for _, s := range Strategies() {
		names = append(names, s.Name())
	}
	return names
}

// Status of a strategy in a Report.
const (
	StatusOK          = "ok"
	StatusUnavailable = "unavailable"
)

// RunResult is what one run of one strategy did.
type RunResult struct {
	// Granted counts requests that believe they got a unit; Denied those
	// told no (or that gave up waiting for a lock); Errors those that
	// failed.
	Granted int64 `json:"granted"`
	Denied  int64 `json:"denied"`
	Errors  int64 `json:"errors"`
	// Leaked is Granted beyond the limit.
	Leaked int64 `json:"leaked"`
	// StaleRejected counts writes the storage refused as stale.
	StaleRejected int64 `json:"stale_rejected"`
	// Counter is what the database's counter says was handed out.
	Counter int64   `json:"counter"`
	WallMS  float64 `json:"wall_ms"`
	// FirstError is the first request error, if any.
	FirstError string `json:"first_error"`
	// Holds counts the spans during which a request believed it held the
	// lock (0 for strategies that measure none); TwoHolders the moments in
	// which two or more requests believed so at once, TwoHoldersMS their
	// total length.
	Holds        int64   `json:"holds"`
	TwoHolders   int64   `json:"two_holders"`
	TwoHoldersMS float64 `json:"two_holders_ms"`
	// Fault says which failure was injected in this run and how.
	Fault string `json:"fault"`
}

// Stat is the minimum, median and maximum of a figure over the runs.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

// Summary holds a Stat per figure.
type Summary struct {
	Granted       Stat `json:"granted"`
	Leaked        Stat `json:"leaked"`
	StaleRejected Stat `json:"stale_rejected"`
	Counter       Stat `json:"counter"`
	WallMS        Stat `json:"wall_ms"`
	TwoHolders    Stat `json:"two_holders"`
}

// StrategyReport is one strategy's part of the Report.
type StrategyReport struct {
	Name     string `json:"name"`
	Safe     bool   `json:"safe"`
	Status   string `json:"status"`
	Reason   string `json:"reason"`
	Injected string `json:"injected"`
	// Runs are the runs in order; Summary their min/median/max.
	Runs    []RunResult `json:"runs"`
	Summary *Summary    `json:"summary"`
	// LeakedRuns counts the runs that leaked; ExactRuns those that granted
	// exactly min(limit, requests) and leaked nothing.
	LeakedRuns int `json:"leaked_runs"`
	ExactRuns  int `json:"exact_runs"`
	// Article is the background article's figure for this strategy, if
	// it reported one (article.go).
	Article string `json:"article"`
}

// Report is the lab's outcome.
type Report struct {
	Requests int     `json:"requests"`
	Limit    int64   `json:"limit"`
	Runs     int     `json:"runs"`
	ThinkMS  float64 `json:"think_ms"`
	TTLMS    float64 `json:"ttl_ms"`
	PauseMS  float64 `json:"pause_ms"`
	Paused   int     `json:"paused"`
	Server   string  `json:"server_version"`
	// SynchronousCommit is what the requests' sessions ran with.
	SynchronousCommit string           `json:"synchronous_commit"`
	Database          string           `json:"database"`
	Kept              bool             `json:"kept"`
	Strategies        []StrategyReport `json:"strategies"`
	// Violations lists safe strategies that did not grant exactly the
	// limit; empty when everything held.
	Violations []string `json:"violations"`
	// ArticleNote says where the article's figures come from and what
	// differs here.
	ArticleNote string `json:"article_note"`
}

// Run creates a scratch database on admin's server, runs the experiment,
// and drops the database unless cfg.Keep.
func Run(ctx context.Context, admin *pgxpool.Pool, cfg Config) (_ *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{
		Requests: cfg.Requests, Limit: cfg.Limit, Runs: cfg.Runs,
		ThinkMS: ms(cfg.Think), TTLMS: ms(cfg.TTL), PauseMS: ms(cfg.Pause), Paused: cfg.Paused,
		Kept: cfg.Keep, Violations: []string{}, SynchronousCommit: sessionParams["synchronous_commit"],
		ArticleNote: articleNote,
	}
	var maxConns int
	if err := admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('max_connections')::int`).
		Scan(&rep.Server, &maxConns); err != nil {
		return nil, fmt.Errorf("read server settings: %w", err)
	}
	if cfg.Requests > maxConns-10 {
		return nil, fmt.Errorf("%d requests need more connections than the server allows (max_connections = %d)", cfg.Requests, maxConns)
	}

	db, err := scratch.Create(ctx, admin, "pgquota_lab")
	if err != nil {
		return nil, err
	}
	rep.Database = db.Name
	if !cfg.Keep {
		defer func() { err = errors.Join(err, db.Drop(ctx)) }()
	}

	env := &Env{Config: cfg, Database: db.Name}
	if env.DB, err = db.Pool(ctx, 2); err != nil {
		return nil, err
	}
	defer env.DB.Close()
	if env.Quota, err = quota.New(env.DB, &quota.Config{MeterProvider: cfg.MeterProvider}); err != nil {
		return nil, err
	}
	if env.Leases, err = lease.New(env.Quota); err != nil {
		return nil, err
	}
	if env.Fences, err = fence.New(env.Quota); err != nil {
		return nil, err
	}
	clients, err := openClients(ctx, db, cfg.Requests, cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range clients {
			c.Pool.Close()
		}
	}()

	want := func(name string) bool { return len(cfg.Strategies) == 0 || slices.Contains(cfg.Strategies, name) }
	for _, s := range Strategies() {
		if !want(s.Name()) {
			continue
		}
		sr, err := runStrategy(ctx, env, clients, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name(), err)
		}
		if sr.Status == StatusOK && s.Safe() && sr.ExactRuns != len(sr.Runs) {
			rep.Violations = append(rep.Violations, fmt.Sprintf("%s granted other than exactly min(limit, requests) in %d of %d runs", s.Name(), len(sr.Runs)-sr.ExactRuns, len(sr.Runs)))
		}
		rep.Strategies = append(rep.Strategies, sr)
	}
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sessionParams are set on every request's connection. The lab shows
// interleavings, not durability: its commits do not wait for the WAL
// flush, so that a slow disk does not eat into the 100ms TTLs. A lease's
// TTL counts from its acquire statement, and with durable commits on a
// busy machine the flush alone can take tens of milliseconds before the
// holder even learns it holds the lease. (The naive locks' table is
// unlogged for the same reason.) Visibility and row locking, and so every
// outcome the lab counts, are the same either way.
//
// default_transaction_isolation is pinned to READ COMMITTED, PostgreSQL's
// default, because the lab shows what each strategy does at that level
// whatever the server's own default says (a startup parameter wins over
// PGOPTIONS).
var sessionParams = map[string]string{
	"synchronous_commit":            "off",
	"default_transaction_isolation": "read committed",
}

// openClients opens n pools of one connection each, all connected.
func openClients(ctx context.Context, db *scratch.Database, n int, mp metric.MeterProvider) ([]*Client, error) {
	clients := make([]*Client, 0, n)
	for i := range n {
		cfg := db.Config(1)
		cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("pgquota lab request %d", i+1)
		for k, v := range sessionParams {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			for _, c := range clients {
				c.Pool.Close()
			}
			return nil, fmt.Errorf("open connection %d of %d: %w", i+1, n, err)
		}
		qc, _ := quota.New(pool, &quota.Config{MeterProvider: mp})
		lc, _ := lease.New(qc)
		fc, _ := fence.New(qc)
		clients = append(clients, &Client{ID: i + 1, Pool: pool, Quota: qc, Leases: lc, Fences: fc})
	}
	return clients, nil
}

func runStrategy(ctx context.Context, env *Env, clients []*Client, s Strategy) (StrategyReport, error) {
	cfg := env.Config
	sr := StrategyReport{Name: s.Name(), Safe: s.Safe(), Status: StatusOK, Injected: s.Injected(cfg), Article: articleFigures[s.Name()]}
	if err := s.Prepare(ctx, env); err != nil {
		if errors.Is(err, ErrUnavailable) {
			sr.Status, sr.Reason = StatusUnavailable, err.Error()
			return sr, nil
		}
		return sr, err
	}
	defer func() { _ = s.Close(context.WithoutCancel(ctx), env) }()
	expect := min(cfg.Limit, int64(len(clients)))
	for run := 1; run <= cfg.Runs; run++ {
		env.Run = run
		env.Faults = &Faults{paused: int64(cfg.Paused), pause: cfg.Pause}
		if err := s.Reset(ctx, env); err != nil {
			return sr, fmt.Errorf("reset: %w", err)
		}
		r, err := race(ctx, env, clients, s)
		if err != nil {
			return sr, err
		}
		if r.Counter, err = s.Counter(ctx, env); err != nil {
			return sr, fmt.Errorf("read counter: %w", err)
		}
		r.Leaked = max(0, r.Granted-cfg.Limit)
		if r.Leaked > 0 {
			sr.LeakedRuns++
		}
		if r.Leaked == 0 && r.Granted == expect && r.Errors == 0 {
			sr.ExactRuns++
		}
		sr.Runs = append(sr.Runs, r)
	}
	sr.Summary = summarize(sr.Runs)
	return sr, nil
}

// race starts every client's request at once and counts the outcomes.
func race(ctx context.Context, env *Env, clients []*Client, s Strategy) (RunResult, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		r        RunResult
		firstErr error
		holds    []Hold
	)
	start := make(chan struct{})
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := s.Request(ctx, env, c)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				r.Errors++
				if firstErr == nil {
					firstErr = err
				}
			case out.Granted:
				r.Granted++
			default:
				r.Denied++
			}
			if out.StaleRejected {
				r.StaleRejected++
			}
			holds = append(holds, out.Holds...)
			if out.Fault != "" {
				r.Fault = out.Fault
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	r.WallMS = ms(time.Since(t0))
	var both time.Duration
	r.Holds = int64(len(holds))
	r.TwoHolders, both = overlaps(holds)
	r.TwoHoldersMS = ms(both)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if firstErr != nil {
		r.FirstError = firstErr.Error()
	}
	return r, nil
}

func summarize(runs []RunResult) *Summary {
	stat := func(f func(RunResult) float64) Stat {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		med := v[len(v)/2]
		if len(v)%2 == 0 {
			med = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		return Stat{Min: v[0], Median: med, Max: v[len(v)-1]}
	}
	return &Summary{
		Granted:       stat(func(r RunResult) float64 { return float64(r.Granted) }),
		Leaked:        stat(func(r RunResult) float64 { return float64(r.Leaked) }),
		StaleRejected: stat(func(r RunResult) float64 { return float64(r.StaleRejected) }),
		Counter:       stat(func(r RunResult) float64 { return float64(r.Counter) }),
		WallMS:        stat(func(r RunResult) float64 { return r.WallMS }),
		TwoHolders:    stat(func(r RunResult) float64 { return float64(r.TwoHolders) }),
	}
}
