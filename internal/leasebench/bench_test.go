package leasebench_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/leasebench"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// op is one benchmarked operation: the library call, and how pgbench runs
// the same statement.
type op struct {
	name   string
	script string // file name of the pgbench script
	// call runs the operation once as client number client.
	call func(ctx context.Context, c *quota.Client, client int, rng *rand.Rand) error
	// vars names the pgbench variable for each placeholder $1, $2, ...
	vars []string
	// header holds the script's meta-commands.
	header string
	// defines are pgbench -D settings.
	defines []string
}

var ops = []op{
	{
		name:   "acquire-free",
		script: "acquire.pgbench",
		call: func(ctx context.Context, c *quota.Client, _ int, rng *rand.Rand) error {
			n := strconv.Itoa(1 + rng.IntN(2_000_000_000))
			_, err := c.Acquire(ctx, quota.AcquireRequest{Name: n, Holder: "bench", TTL: time.Minute, Attempt: n})
			if err != nil && !errorsIsHeld(err) { // a rare repeated random name
				return err
			}
			return nil
		},
		vars:    []string{"ttl", "n", "holder", "n"},
		header:  "\\set n random(1, 2000000000)\n",
		defines: []string{"ttl=60s", "holder=bench"},
	},
	{
		name:   "fence-write",
		script: "fence_write.pgbench",
		call: func(ctx context.Context, c *quota.Client, client int, rng *rand.Rand) error {
			res := strconv.Itoa(client)
			_, err := c.FenceWrite(ctx, quota.FenceWriteRequest{
				Resource: res, Key: strconv.Itoa(1 + rng.IntN(1000)), Value: "x",
				Token: leasebench.HolderTokenBase + int64(client), Lease: res,
			})
			return err
		},
		vars:    []string{"client_id", "k", "value", "tok", "client_id"},
		header:  "\\set k random(1, 1000)\n\\set tok 1000000 + :client_id\n",
		defines: []string{"value=x"},
	},
}

func errorsIsHeld(err error) bool {
	_, ok := err.(*quota.LeaseHeldError)
	return ok
}

func connect(tb testing.TB, url string, conns int32, rec *leasebench.Recorder) (*pgxpool.Pool, *quota.Client) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(tb, err)
	cfg.MaxConns = conns
	if rec != nil {
		cfg.ConnConfig.Tracer = rec
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	c, err := quota.New(pool, nil)
	require.NoError(tb, err)
	require.NoError(tb, leasebench.SetupHolders(context.Background(), pool, 64))
	return pool, c
}

// Each operation is one statement, so one round trip, and the checked-in
// pgbench scripts run exactly that statement. Set PGQUOTA_UPDATE_SCRIPTS=1
// to rewrite them.
func TestPgbenchScriptsMatchLibrary(t *testing.T) {
	t.Parallel()
	rec := &leasebench.Recorder{}
	_, c := connect(t, pgtest.NewURL(t), 2, rec)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, o := range ops {
		rec.Take()
		require.NoError(t, o.call(context.Background(), c, 0, rng))
		sent := rec.Take()
		require.Len(t, sent, 1, "%s must be one statement", o.name)
		script, err := leasebench.PgbenchScript(sent[0], o.vars, o.header)
		require.NoError(t, err)
		if os.Getenv("PGQUOTA_UPDATE_SCRIPTS") != "" {
			require.NoError(t, os.WriteFile(o.script, []byte(script), 0o644))
		}
		have, err := os.ReadFile(o.script)
		require.NoError(t, err)
		require.Equal(t, script, string(have), "%s drifted from the library's SQL: run with PGQUOTA_UPDATE_SCRIPTS=1", o.script)
	}
}

func BenchmarkLease(b *testing.B) {
	url := pgtest.NewURL(b)
	for _, o := range ops {
		for _, clients := range []int{8, 32} {
			b.Run(fmt.Sprintf("%s/clients=%d", o.name, clients), func(b *testing.B) {
				_, c := connect(b, url, int32(clients), nil)
				b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				var next atomic.Int64
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					client := int(next.Add(1)-1) % 64
					rng := rand.New(rand.NewPCG(uint64(client), uint64(time.Now().UnixNano())))
					for pb.Next() {
						if err := o.call(context.Background(), c, client, rng); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// TestCompareWithPgbench prints library and pgbench throughput and their
// ratio (medians of 3 alternating rounds) for each operation at 8 and 32
// clients. It runs only when
// PGQUOTA_LEASE_BENCH holds a duration per measurement (e.g. 10s).
func TestCompareWithPgbench(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("PGQUOTA_LEASE_BENCH"))
	if err != nil || d <= 0 {
		t.Skip("set PGQUOTA_LEASE_BENCH=10s (a duration per measurement) to compare with pgbench")
	}
	pgbench, err := exec.LookPath("pgbench")
	require.NoError(t, err, "pgbench must be installed")
	url := pgtest.NewURL(t)
	dir := t.TempDir()
	for _, o := range ops {
		script, err := filepath.Abs(o.script)
		require.NoError(t, err)
		for _, clients := range []int{8, 32} {
			_, c := connect(t, url, int32(clients), nil)
			// Alternate the two sides and keep the medians, so that a
			// burst of load elsewhere on the machine skews one round only.
			var libs, pgs []float64
			for range rounds {
				libs = append(libs, libraryTPS(t, c, o, clients, d))
				pgs = append(pgs, pgbenchTPS(t, pgbench, dir, script, url, o, clients, d))
			}
			lib, pg := median(libs), median(pgs)
			t.Logf("%-12s clients=%-2d library %8.0f tps  pgbench %8.0f tps  ratio library/pgbench %.2f  (median of %d)",
				o.name, clients, lib, pg, lib/pg, rounds)
		}
	}
}

// rounds is how many times each side is measured.
const rounds = 3

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// pgbenchTPS runs o's script with pgbench -M prepared and returns its tps.
func pgbenchTPS(t *testing.T, pgbench, dir, script, url string, o op, clients int, d time.Duration) float64 {
	t.Helper()
	args := []string{"-n", "-M", "prepared", "-c", fmt.Sprint(clients), "-j", fmt.Sprint(min(clients, 4)),
		"-T", fmt.Sprint(max(int(d.Seconds()), 1)), "-f", script}
	for _, def := range o.defines {
		args = append(args, "-D", def)
	}
	cmd := exec.Command(pgbench, append(args, url)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	m := tpsLine.FindSubmatch(out)
	require.NotNil(t, m, "%s", out)
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return tps
}

// libraryTPS runs o on clients goroutines for d, after a short warm-up,
// and returns operations per second.
func libraryTPS(t *testing.T, c *quota.Client, o op, clients int, d time.Duration) float64 {
	t.Helper()
	run := func(d time.Duration) (int64, error) {
		var n atomic.Int64
		var firstErr error
		var mu sync.Mutex
		deadline := time.Now().Add(d)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
				for time.Now().Before(deadline) {
					if err := o.call(context.Background(), c, i, rng); err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
						return
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		return n.Load(), firstErr
	}
	_, err := run(500 * time.Millisecond)
	require.NoError(t, err)
	start := time.Now()
	n, err := run(d)
	require.NoError(t, err)
	return float64(n) / time.Since(start).Seconds()
}
