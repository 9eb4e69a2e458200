package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// BenchmarkGrantGroupCommit measures Grant with and without
// Config.GroupCommit, N concurrent callers on a pool of N connections, durable
// commits (the test server's synchronous_commit, on by default): spread
// over 10,000 existing counters, and on one hot counter. "single" is Grant
// without group commit (one statement and one commit per call), "group" is
// Grant with it, "coalesce" (hot row only) is Config.Coalesce. It reports
// grants/s and statements/op (statements sent per grant, from the group
// path's hook: 1 for single).
//
//	go test ./quota -run '^$' -bench GrantGroupCommit -benchtime 3s
//
// PGQUOTA_BENCH_INFLIGHT=1,2,4 adds "group-inflightN" cases with N
// statements per lane in flight instead of the default.
func BenchmarkGrantGroupCommit(b *testing.B) {
	ctx := context.Background()
	url := pgtest.NewURL(b)
	setupPool := pgtest.ConnectOwner(b, url, 2) // defines, then writes pgquota's rows in bulk on purpose
	setup, err := quota.New(setupPool, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := setup.DefineQuota(ctx, quota.Definition{Name: "bench", Window: quota.WindowDay}); err != nil {
		b.Fatal(err)
	}
	members := make([]string, spreadMembers)
	for i := range members {
		members[i] = strconv.Itoa(i + 1)
	}
	if _, err := setupPool.Exec(ctx, `
		INSERT INTO pgquota.usage (quota_name, member, window_start, window_end, used)
		SELECT 'bench', m, pgquota.window_start('day', 'UTC', pgquota.clock()),
		       pgquota.window_end('day', 'UTC', pgquota.clock()), 0
		FROM unnest($1::text[]) AS m
		UNION ALL
		SELECT 'bench', 'hot', pgquota.window_start('day', 'UTC', pgquota.clock()),
		       pgquota.window_end('day', 'UTC', pgquota.clock()), 0`, members); err != nil {
		b.Fatal(err)
	}
	type mode struct {
		name     string
		cfg      quota.Config
		inFlight int
	}
	modes := []mode{{name: "single", cfg: quota.Config{Grouping: quota.GroupNone}}, {name: "group", cfg: quota.Config{Grouping: quota.GroupAcrossCounters}}}
	if s := os.Getenv("PGQUOTA_BENCH_INFLIGHT"); s != "" {
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				b.Fatalf("PGQUOTA_BENCH_INFLIGHT: %q is not a positive count", f)
			}
			modes = append(modes, mode{name: fmt.Sprintf("group-inflight%d", n), cfg: quota.Config{Grouping: quota.GroupAcrossCounters}, inFlight: n})
		}
	}
	hot := func(*rand.Rand) string { return "hot" }
	spread := func(rng *rand.Rand) string { return members[rng.IntN(len(members))] }
	for _, w := range []struct {
		name   string
		member func(*rand.Rand) string
		modes  []mode
	}{
		{"spread", spread, modes},
		{"hot-row", hot, append(cloneModes(modes), mode{name: "coalesce", cfg: quota.Config{Grouping: quota.GroupByCounter}})},
	} {
		for _, clients := range []int{1, 8, 32, 64} {
			for _, m := range w.modes {
				b.Run(fmt.Sprintf("%s/clients=%d/%s", w.name, clients, m.name), func(b *testing.B) {
					benchGroupGrant(b, url, clients, w.member, m.cfg, m.inFlight)
				})
			}
		}
	}
}

func cloneModes[T any](s []T) []T { return append([]T(nil), s...) }

func benchGroupGrant(b *testing.B, url string, clients int, member func(*rand.Rand) string, cfg quota.Config, inFlight int) {
	ctx := context.Background()
	pool := pgtest.Connect(b, url, int32(clients))
	// Connect all N before the clock starts (released before any Fatal:
	// the pool's cleanup waits for its connections).
	conns := make([]interface{ Release() }, 0, clients)
	var connErr error
	for range clients {
		c, err := pool.Acquire(ctx)
		if err != nil {
			connErr = err
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if connErr != nil {
		b.Fatalf("connect %d clients (the server's max_connections?): %v", clients, connErr)
	}
	client, err := quota.New(pool, &cfg)
	if err != nil {
		b.Fatal(err)
	}
	var statements atomic.Int64
	if cfg.GroupCommit {
		quota.SetGroupSend(client, func([]quota.GrantRequest) { statements.Add(1) })
		if inFlight > 0 {
			quota.SetGroupInFlight(client, inFlight)
		}
	}
	limit := quota.MaxUnits
	b.ReportAllocs()
	b.ResetTimer()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
	)
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for next.Add(1) <= int64(b.N) {
				res, err := client.Grant(ctx, quota.GrantRequest{Quota: "bench", Member: member(rng), Amount: 1, Limit: &limit})
				if err == nil && !res.Granted {
					err = fmt.Errorf("denied: %+v", res)
				}
				if err != nil {
					errOnce.Do(func() { b.Error(err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
	if cfg.GroupCommit {
		b.ReportMetric(float64(statements.Load())/float64(b.N), "statements/op")
	}
}
