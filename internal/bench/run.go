package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/scratch"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"go.opentelemetry.io/otel/metric"
)

// Latency holds latency percentiles in milliseconds.
type Latency struct {
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
}

// percentiles computes nearest-rank percentiles of samples (sorted in
// place).
func percentiles(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	at := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(samples)))) - 1
		i = max(0, min(i, len(samples)-1))
		return float64(samples[i].Microseconds()) / 1000
	}
	return Latency{P50: at(50), P95: at(95), P99: at(99)}
}

// LibraryResult is what one measured run through the library did.
type LibraryResult struct {
	// Ops counts the operations that completed within the run's duration;
	// OpsPerSec is Ops divided by the duration.
	Ops       int64   `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	Latency
	// Granted counts the operations that got what they asked for.
	Granted int64 `json:"granted"`
	// Retries counts retried transactions (serializable).
	Retries int64 `json:"retries"`
	// Connections is the number of connections the pool held at the end:
	// the run's client count, each connected before the clock started.
	Connections int32 `json:"connections"`
	// CPUMicrosPerOp is the bench process's CPU time (user + system)
	// during the run per operation: the client's cost, which competes with
	// the server when both share a machine.
	CPUMicrosPerOp float64 `json:"cpu_us_per_op"`
	// Errors counts operations that failed; FirstError is the first one.
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error"`
}

// sessionParams are set on every connection the bench opens, library and
// pgbench alike: commits wait for their WAL flush (durable), whatever the
// server's default.
var sessionParams = map[string]string{"synchronous_commit": "on"}

// openPool opens a pool of exactly n connections on the scratch database,
// all connected before it returns, with tracer (when not nil) on each.
func openPool(ctx context.Context, db *scratch.Database, n int, tracer *recorder) (*pgxpool.Pool, error) {
	cfg := db.Config(int32(n))
	cfg.MinConns = 0
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgquota bench"
	for k, v := range sessionParams {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Connect all n up front, as pgbench does before its clock starts.
	conns := make([]*pgxpool.Conn, 0, n)
	var err2 error
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			err2 = err
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if err2 != nil {
		pool.Close()
		return nil, fmt.Errorf("open %d connections: %w", n, err2)
	}
	return pool, nil
}

func newEnv(pool *pgxpool.Pool, mp metric.MeterProvider) (Env, error) {
	// The plain strategies measure one statement per call: their client
	// groups nothing (the grouped ones make clients of their own).
	client, err := quota.New(pool, &quota.Config{Grouping: quota.GroupNone, MeterProvider: mp})
	if err != nil {
		return Env{}, err
	}
	env := Env{Pool: pool, Client: client, MeterProvider: mp}
	if env.Leases, err = lease.New(client); err != nil {
		return Env{}, err
	}
	env.Fences, err = fence.New(client)
	return env, err
}

// Capture runs one operation of s twice through a traced connection and
// returns the pgbench script built from the statements it sent.
func Capture(ctx context.Context, db *scratch.Database, s Strategy) (*Script, error) {
	rec := &recorder{}
	pool, err := openPool(ctx, db, 1, rec)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	env, err := newEnv(pool, nil)
	if err != nil {
		return nil, err
	}
	op, err := s.Setup(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("%s: setup: %w", s.Name(), err)
	}
	a, b := samples(op.Vars)
	rec.take()
	if _, err := op.Do(ctx, a); err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name(), err)
	}
	capA := rec.take()
	if _, err := op.Do(ctx, b); err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name(), err)
	}
	capB := rec.take()
	script, err := BuildScript(s.Name(), op.Vars, a, b, capA, capB)
	if err != nil {
		return nil, err
	}
	script.MaxTries = op.MaxTries
	return script, nil
}

// RunLibrary measures s through the library: clients goroutines on a pool
// of exactly clients connections, each calling the operation back to back
// for d. tick, when not nil, is called about every 100ms with the time
// elapsed. mp, when not nil, is the MeterProvider of the clients the run
// creates.
func RunLibrary(ctx context.Context, db *scratch.Database, s Strategy, clients int, d time.Duration, tick func(time.Duration), mp metric.MeterProvider) (LibraryResult, error) {
	pool, err := openPool(ctx, db, clients, nil)
	if err != nil {
		return LibraryResult{}, err
	}
	defer pool.Close()
	env, err := newEnv(pool, mp)
	if err != nil {
		return LibraryResult{}, err
	}
	op, err := s.Setup(ctx, env)
	if err != nil {
		return LibraryResult{}, fmt.Errorf("%s: setup: %w", s.Name(), err)
	}

	// Operations in flight when the time is up finish (a cancelled
	// statement would leave work behind) but are not counted; the grace
	// period only bounds a hung run.
	runCtx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		res      LibraryResult
		samples  []time.Duration
		firstErr error
		failed   atomic.Int64
	)
	cpu0 := processCPU()
	start := time.Now()
	end := start.Add(d)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(i)))
			vals := make([]int64, len(op.Vars))
			var local LibraryResult
			lat := make([]time.Duration, 0, 1024)
			var errOnce error
			for {
				t0 := time.Now()
				if !t0.Before(end) || runCtx.Err() != nil {
					break
				}
				for j, v := range op.Vars {
					vals[j] = v.Min + rng.Int64N(v.Max-v.Min+1)
				}
				out, err := op.Do(runCtx, vals)
				t1 := time.Now()
				if t1.After(end) {
					break
				}
				if err != nil {
					local.Errors++
					if errOnce == nil {
						errOnce = err
					}
					// An erroring strategy should not spin: give up after
					// many failures in a row.
					if failed.Add(1) > 1000 && local.Ops == 0 {
						break
					}
					continue
				}
				local.Ops++
				local.Retries += int64(out.Retries)
				if out.Granted {
					local.Granted++
				}
				lat = append(lat, t1.Sub(t0))
			}
			mu.Lock()
			res.Ops += local.Ops
			res.Granted += local.Granted
			res.Retries += local.Retries
			res.Errors += local.Errors
			samples = append(samples, lat...)
			if firstErr == nil && errOnce != nil {
				firstErr = errOnce
			}
			mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-ticker.C:
			if tick != nil {
				tick(min(time.Since(start), d))
			}
		}
	}
	if res.Ops > 0 {
		res.CPUMicrosPerOp = float64((processCPU() - cpu0).Microseconds()) / float64(res.Ops)
	}
	res.Connections = pool.Stat().TotalConns()
	res.OpsPerSec = float64(res.Ops) / d.Seconds()
	res.Latency = percentiles(samples)
	if firstErr != nil {
		res.FirstError = firstErr.Error()
	}
	if res.Ops == 0 && firstErr != nil {
		return res, fmt.Errorf("%s: every operation failed: %w", s.Name(), firstErr)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if errors.Is(runCtx.Err(), context.DeadlineExceeded) {
		return res, fmt.Errorf("%s: operations still running 30s after the end of the run", s.Name())
	}
	return res, nil
}

// processCPU returns the CPU time (user + system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
