package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgquota/pgquota/internal/scratch"
	"github.com/pgquota/pgquota/quota/lease"
	"go.opentelemetry.io/otel/metric"
)

// The bench beside the peers users pick instead (issue 15, item 3): each
// case through pgquota, through pgbench on the same SQL, and through a
// Redis peer (go-redis/redis_rate for grants, bsm/redislock for a lock)
// against two Redis servers the bench starts itself: one as Debian starts
// it without persistence, one durable (--appendonly yes --appendfsync
// always), so that both sides pay for durable commits.

// PeerSides are the sides of a peers case, in the order they run.
var PeerSides = []string{"pgquota", "pgbench", "redis", "redis-aof"}

// PeersConfig says what RunPeers measures.
type PeersConfig struct {
	// Clients lists the client counts. Defaults to 1, 8, 32, 64.
	Clients []int
	// Duration of each run, whole seconds (pgbench -T).
	Duration time.Duration
	// PgbenchPath is the pgbench binary. Defaults to "pgbench" on $PATH.
	PgbenchPath string
	// The redis-server binary is $PGQUOTA_REDIS_SERVER, else redis-server
	// on $PATH (internal/svcproc).
	// Cases limits the run to these case names (PeerCases); empty for all.
	Cases []string
	// Progress, when not nil, is called before each run with its label.
	Progress func(label string)
	// MeterProvider, when not nil, is the Config.MeterProvider of the
	// pgquota clients the library runs create (`--metrics-addr`); nil
	// records nothing. Each run carries its own, so concurrent runs never
	// share one.
	MeterProvider metric.MeterProvider
}

// PeerCase is one workload measured on every side.
type PeerCase struct {
	Name     string
	Describe string
	// pgquota is the library side; pgbench builds pgbench's script.
	pgquota Strategy
	pgbench func(ctx context.Context, db *scratch.Database) (*Script, Strategy, error)
	// peer is the Redis side on a client with pool size = clients.
	peer func(rdb *redis.Client, prefix string) Strategy
}

// PeerCases returns the cases of RunPeers.
func PeerCases() []PeerCase {
	return []PeerCase{
		{
			Name:     "grant-spread",
			Describe: fmt.Sprintf("one unit granted to one of %d members, default Config (redis_rate Allow on one of %d keys)", SpreadMembers, SpreadMembers),
			pgquota:  grantSpreadGrouped{},
			pgbench:  captured(grantSpread{}),
			peer: func(rdb *redis.Client, prefix string) Strategy {
				return redisRate{rdb: rdb, prefix: prefix, members: SpreadMembers}
			},
		},
		{
			Name:     "grant-hot",
			Describe: "one unit granted to one hot member, default Config (pgbench: the single-row grant; redis_rate on one key)",
			pgquota:  grantHotGrouped{},
			pgbench:  captured(grantHot{}),
			peer: func(rdb *redis.Client, prefix string) Strategy {
				return redisRate{rdb: rdb, prefix: prefix, members: 1}
			},
		},
		{
			Name:     "rate-spread",
			Describe: fmt.Sprintf("one unit of a rate (GCRA) to one of %d members, default Config (redis_rate Allow on one of %d keys)", SpreadMembers, SpreadMembers),
			pgquota:  rateSpread{},
			pgbench:  captured(rateSpread{}),
			peer: func(rdb *redis.Client, prefix string) Strategy {
				return redisRate{rdb: rdb, prefix: prefix, members: SpreadMembers}
			},
		},
		{
			Name:     "rate-hot",
			Describe: "one unit of a rate (GCRA) to one hot member, default Config (pgbench: the single call; redis_rate on one key)",
			pgquota:  rateHot{mode: "grouped"},
			pgbench:  captured(rateHot{}),
			peer: func(rdb *redis.Client, prefix string) Strategy {
				return redisRate{rdb: rdb, prefix: prefix, members: 1}
			},
		},
		{
			Name:     "lease-cycle",
			Describe: fmt.Sprintf("a lease acquired and released, one of %d names (bsm/redislock Obtain + Release)", LeaseCycleNames),
			pgquota:  leaseCycle{},
			pgbench:  leaseCycleScript,
			peer: func(rdb *redis.Client, prefix string) Strategy {
				return redisLock{rdb: rdb, prefix: prefix}
			},
		},
	}
}

func captured(s Strategy) func(ctx context.Context, db *scratch.Database) (*Script, Strategy, error) {
	return func(ctx context.Context, db *scratch.Database) (*Script, Strategy, error) {
		sc, err := Capture(ctx, db, s)
		return sc, s, err
	}
}

// PeerResult is one side of one case at one client count.
type PeerResult struct {
	Case      string  `json:"case"`
	Side      string  `json:"side"`
	Clients   int     `json:"clients"`
	OpsPerSec float64 `json:"ops_per_sec"`
	Latency
	Errors int64  `json:"errors"`
	Note   string `json:"note"`
}

// PeersReport is what RunPeers measured.
type PeersReport struct {
	Server     Server       `json:"server"`
	Redis      string       `json:"redis"`
	DurationMS int64        `json:"duration_ms"`
	Clients    []int        `json:"clients"`
	Cases      []PeerCase   `json:"-"`
	Results    []PeerResult `json:"results"`
}

// Get returns the result of one side, or false.
func (r *PeersReport) Get(c, side string, clients int) (PeerResult, bool) {
	for _, x := range r.Results {
		if x.Case == c && x.Side == side && x.Clients == clients {
			return x, true
		}
	}
	return PeerResult{}, false
}

// Ratio is pgquota's ops/s over side's ("higher is better" for pgquota),
// or 0 when either is missing.
func (r *PeersReport) Ratio(c, side string, clients int) float64 {
	p, ok1 := r.Get(c, "pgquota", clients)
	o, ok2 := r.Get(c, side, clients)
	if !ok1 || !ok2 || o.OpsPerSec == 0 {
		return 0
	}
	return p.OpsPerSec / o.OpsPerSec
}

// RunPeers creates a scratch database on admin's server, starts the two
// Redis servers, and measures every case on every side at every client
// count, one run each.
func RunPeers(ctx context.Context, admin *pgxpool.Pool, cfg PeersConfig) (_ *PeersReport, err error) {
	if len(cfg.Clients) == 0 {
		cfg.Clients = []int{1, 8, 32, 64}
	}
	secs := cfg.Duration.Seconds()
	if secs < 1 || secs != float64(int(secs)) {
		return nil, fmt.Errorf("the duration must be whole seconds (pgbench -T), got %s", cfg.Duration)
	}
	pgbenchPath, err := LookPgbench(cfg.PgbenchPath)
	if err != nil {
		return nil, err
	}
	cases := PeerCases()
	if len(cfg.Cases) > 0 {
		var sel []PeerCase
		for _, name := range cfg.Cases {
			found := false
			for _, c := range cases {
				if c.Name == name {
					sel, found = append(sel, c), true
				}
			}
			if !found {
				return nil, fmt.Errorf("unknown peers case %q (known: grant-spread, grant-hot, rate-spread, rate-hot, lease-cycle)", name)
			}
		}
		cases = sel
	}
	progress := func(label string) {
		if cfg.Progress != nil {
			cfg.Progress(label)
		}
	}

	rep := &PeersReport{DurationMS: cfg.Duration.Milliseconds(), Clients: cfg.Clients, Cases: cases}
	if err := admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync')`).
		Scan(&rep.Server.Version, &rep.Server.Fsync); err != nil {
		return nil, fmt.Errorf("read server settings: %w", err)
	}
	rep.Server.SynchronousCommit = sessionParams["synchronous_commit"]

	progress("starting redis-server twice (no persistence; appendonly, appendfsync always)")
	plain, err := StartRedis(ctx, false)
	if err != nil {
		return nil, err
	}
	defer plain.Stop()
	durable, err := StartRedis(ctx, true)
	if err != nil {
		return nil, err
	}
	defer durable.Stop()
	rep.Redis = plain.Version

	db, err := scratch.Create(ctx, admin, "pgquota_peers")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, db.Drop(ctx)) }()
	rep.Server.Database = db.Name

	for _, pc := range cases {
		script, base, err := pc.pgbench(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("%s: pgbench script: %w", pc.Name, err)
		}
		for _, n := range cfg.Clients {
			label := fmt.Sprintf("%s, clients=%d", pc.Name, n)
			progress(label + " (pgquota)")
			lib, err := RunLibrary(ctx, db, pc.pgquota, n, cfg.Duration, nil, cfg.MeterProvider)
			if err != nil {
				return nil, fmt.Errorf("%s at %d clients: %w", pc.Name, n, err)
			}
			rep.Results = append(rep.Results, PeerResult{Case: pc.Name, Side: "pgquota", Clients: n,
				OpsPerSec: lib.OpsPerSec, Latency: lib.Latency, Errors: lib.Errors, Note: lib.FirstError})

			progress(label + " (pgbench)")
			pg, err := runPgbench(ctx, db, base, script, n, cfg.Duration, pgbenchPath, func(time.Duration) {})
			if err != nil {
				return nil, fmt.Errorf("%s at %d clients: pgbench: %w", pc.Name, n, err)
			}
			rep.Results = append(rep.Results, PeerResult{Case: pc.Name, Side: "pgbench", Clients: n,
				OpsPerSec: pg.TPS, Latency: pg.Latency, Errors: pg.Failed, Note: pg.Note})

			for _, rs := range []struct {
				side string
				srv  *RedisServer
			}{{"redis", plain}, {"redis-aof", durable}} {
				progress(label + " (" + rs.side + ")")
				r, err := runRedisPeer(ctx, db, rs.srv, pc, n, cfg.Duration)
				if err != nil {
					return nil, fmt.Errorf("%s at %d clients: %s: %w", pc.Name, n, rs.side, err)
				}
				rep.Results = append(rep.Results, PeerResult{Case: pc.Name, Side: rs.side, Clients: n,
					OpsPerSec: r.OpsPerSec, Latency: r.Latency, Errors: r.Errors, Note: r.FirstError})
			}
		}
	}
	return rep, nil
}

// runRedisPeer runs pc's Redis side with n clients: a go-redis client
// whose pool holds n connections, all connected before the clock starts.
// (RunLibrary's PostgreSQL pool of n connections stays idle meanwhile.)
func runRedisPeer(ctx context.Context, db *scratch.Database, srv *RedisServer, pc PeerCase, n int, d time.Duration) (LibraryResult, error) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: n, MinIdleConns: n})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return LibraryResult{}, fmt.Errorf("FLUSHALL: %w", err)
	}
	// Open all n connections, as pgbench and the pgx pool do.
	conns := make([]*redis.Conn, 0, n)
	for range n {
		c := rdb.Conn()
		if err := c.Ping(ctx).Err(); err != nil {
			return LibraryResult{}, fmt.Errorf("PING: %w", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		_ = c.Close()
	}
	return RunLibrary(ctx, db, pc.peer(rdb, "pgquota-bench:"+pc.Name+":"), n, d, nil, nil)
}

// redisRate is go-redis/redis_rate's Allow (a GCRA limiter in one Lua
// script) with a limit no run reaches, on one of members keys.
type redisRate struct {
	rdb     *redis.Client
	prefix  string
	members int64
}

func (redisRate) Name() string     { return "redis_rate" }
func (redisRate) Describe() string { return "go-redis/redis_rate Allow" }
func (s redisRate) Setup(context.Context, Env) (Op, error) {
	limit := redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: 24 * time.Hour}
	key := func(vals []int64) string { return s.prefix + strconv.FormatInt(vals[0], 10) }
	return redisRateOp(s.rdb, limit, Var{Name: "member", Min: 1, Max: s.members}, key), nil
}

// redisLock is bsm/redislock's Obtain then Release, on one of
// LeaseCycleNames keys, as lease-cycle does.
type redisLock struct {
	rdb    *redis.Client
	prefix string
}

func (redisLock) Name() string     { return "redislock" }
func (redisLock) Describe() string { return "bsm/redislock Obtain + Release" }
func (s redisLock) Setup(context.Context, Env) (Op, error) {
	locker := redislock.New(s.rdb)
	return Op{
		Vars: []Var{{Name: "lease", Min: 1, Max: LeaseCycleNames}},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			l, err := locker.Obtain(ctx, s.prefix+strconv.FormatInt(vals[0], 10), acquireTTL, nil)
			if errors.Is(err, redislock.ErrNotObtained) {
				return Outcome{}, nil // held by another client: as a held lease
			}
			if err != nil {
				return Outcome{}, err
			}
			return Outcome{Granted: true}, l.Release(ctx)
		},
	}, nil
}

// LeaseCycleNames is how many lease names lease-cycle spreads over.
const LeaseCycleNames = 10000

// leaseCycle is pgquota's Acquire then Release of one of LeaseCycleNames
// leases (a held one is left alone: another client has it).
type leaseCycle struct{}

func (leaseCycle) Name() string { return "lease-cycle" }
func (leaseCycle) Describe() string {
	return fmt.Sprintf("pgquota Acquire + Release, one of %d names", LeaseCycleNames)
}
func (leaseCycle) Setup(ctx context.Context, env Env) (Op, error) {
	if _, err := env.Pool.Exec(ctx, `TRUNCATE pgquota.lease, pgquota.fence, pgquota.lease_waiter`); err != nil {
		return Op{}, fmt.Errorf("reset leases: %w", err)
	}
	return Op{
		Vars: []Var{{Name: "lease", Min: 1, Max: LeaseCycleNames}, {Name: "attempt", Min: 1, Max: uniqueMax}},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			name := strconv.FormatInt(vals[0], 10)
			l, err := env.Leases.Acquire(ctx, lease.AcquireRequest{
				Name: name, Holder: acquireHolder, TTL: acquireTTL, Attempt: strconv.FormatInt(vals[1], 10),
			})
			if errors.Is(err, lease.ErrHeld) {
				return Outcome{}, nil
			}
			if err != nil {
				return Outcome{}, err
			}
			_, err = env.Leases.Release(ctx, lease.Lease{Name: name, Token: l.Token})
			return Outcome{Granted: err == nil}, err
		},
	}, nil
}

// leaseCycleScript builds lease-cycle's pgbench script from the statements
// the library sends: the acquire, whose row sets :taken and :token
// (\gset), then, when taken, the release with that token.
func leaseCycleScript(ctx context.Context, db *scratch.Database) (*Script, Strategy, error) {
	rec := &recorder{}
	pool, err := openPool(ctx, db, 1, rec)
	if err != nil {
		return nil, nil, err
	}
	defer pool.Close()
	env, err := newEnv(pool, nil)
	if err != nil {
		return nil, nil, err
	}
	op, err := leaseCycle{}.Setup(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	// Distinct values, so that each argument is known by its value (sqlc
	// numbers the parameters in their order of first use in the SQL).
	const probeName, probeAttempt = 7, 123456789
	rec.take()
	if _, err := op.Do(ctx, []int64{probeName, probeAttempt}); err != nil {
		return nil, nil, err
	}
	stmts := rec.take()
	if len(stmts) != 2 {
		return nil, nil, fmt.Errorf("lease-cycle sent %d statements, want 2 (acquire, release)", len(stmts))
	}
	acq, rel := stmts[0], stmts[1]
	var defines []string
	names := func(s Statement, token string) ([]string, error) {
		out := make([]string, len(s.Args))
		for i, a := range s.Args {
			text, err := argText(a)
			if err != nil {
				return nil, err
			}
			switch text {
			case strconv.Itoa(probeName):
				out[i] = "lease"
			case strconv.Itoa(probeAttempt):
				out[i] = "attempt"
			case acquireHolder:
				out[i] = "holder"
			case token:
				out[i] = "token"
			default:
				out[i] = fmt.Sprintf("c%d", len(defines)+1)
				defines = append(defines, out[i]+"="+text)
			}
		}
		return out, nil
	}
	acqNames, err := names(acq, "")
	if err != nil {
		return nil, nil, err
	}
	var token int64
	if err := pool.QueryRow(ctx, `SELECT token FROM pgquota.lease WHERE name = $1`, strconv.Itoa(probeName)).Scan(&token); err != nil {
		return nil, nil, fmt.Errorf("lease-cycle: read the probe's token: %w", err)
	}
	relNames, err := names(rel, strconv.FormatInt(token, 10))
	if err != nil {
		return nil, nil, err
	}
	if !slices.Contains(relNames, "token") || !slices.Contains(relNames, "lease") || !slices.Contains(acqNames, "attempt") {
		return nil, nil, fmt.Errorf("lease-cycle: arguments not recognised (acquire %v, release %v)", acqNames, relNames)
	}
	body := func(s Statement, names []string) string {
		b := strings.TrimRight(strings.TrimSpace(stripLeadingComments(s.SQL)), ";")
		for i := len(names); i >= 1; i-- {
			b = strings.ReplaceAll(b, "$"+strconv.Itoa(i), ":"+names[i-1])
		}
		return b
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\\set lease random(1, %d)\n\\set attempt random(1, %d)\n", LeaseCycleNames, int64(uniqueMax))
	// \gset stores the acquire's row: :taken and :token (and :name,
	// :holder, :attempt, which the next \set and the same holder make
	// harmless).
	sb.WriteString(body(acq, acqNames) + "\n\\gset\n")
	sb.WriteString("\\if :taken\n" + body(rel, relNames) + ";\n\\endif\n")
	return &Script{
		Strategy:   "lease-cycle",
		Text:       sb.String(),
		Defines:    append(defines, "holder="+acquireHolder),
		Statements: stmts,
		Vars:       op.Vars,
	}, leaseCycle{}, nil
}

// WritePeersChart draws the peers report like WriteChart: operations per
// second against clients, one line per case and side.
func WritePeersChart(rep *PeersReport, path string) error {
	r := &Report{Clients: rep.Clients, DurationMS: rep.DurationMS}
	for _, c := range rep.Cases {
		for _, side := range PeerSides {
			for _, n := range rep.Clients {
				if x, ok := rep.Get(c.Name, side, n); ok {
					r.Results = append(r.Results, Result{Strategy: c.Name + " " + side, Clients: n,
						Library: LibraryResult{OpsPerSec: x.OpsPerSec}})
				}
			}
		}
	}
	return WriteChart(r, path)
}
