package quota_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// BenchmarkClientMemoryFlat grants once on each of 1,000,000 distinct
// counters and claims once from each of 100,000 sharded campaigns through
// ONE Client, twice over (the second pass on new counters and the same
// campaigns), and reports the heap after each pass above that of the fresh
// Client (runtime.MemStats.HeapAlloc after runtime.GC): heap-MB-pass1 and
// heap-MB-pass2. The target is under 50 MB, and pass 2 no higher than pass
// 1 (no growth with more counters and campaigns touched). Each case runs
// once whatever -benchtime says; it takes minutes:
//
//	go test ./quota -run '^$' -bench ClientMemoryFlat -benchtime 1x -timeout 60m
//
// Cases: "group" (Config.GroupCommit), "coalesce" (Config.Coalesce),
// "single" (neither). PGQUOTA_BENCH_MEM_COUNTERS and
// PGQUOTA_BENCH_MEM_CAMPAIGNS change the counts (1,000,000 and 100,000).
func BenchmarkClientMemoryFlat(b *testing.B) {
	counters := envInt(b, "PGQUOTA_BENCH_MEM_COUNTERS", 1_000_000)
	campaigns := envInt(b, "PGQUOTA_BENCH_MEM_CAMPAIGNS", 100_000)
	ctx := context.Background()
	url := pgtest.NewURL(b)
	setupPool := pgtest.ConnectOwner(b, url, 2) // defines, then writes pgquota's rows in bulk on purpose
	setup, err := quota.New(setupPool, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := setup.DefineQuota(ctx, quota.Definition{Name: "mem", Window: quota.WindowNone, DefaultLimit: ptr(quota.MaxUnits)}); err != nil {
		b.Fatal(err)
	}
	// The campaigns in one statement: sharded pools of 4 units in 2 shards.
	if _, err := setupPool.Exec(ctx, `
		WITH p AS (
			INSERT INTO pgquota.voucher_pool (campaign, kind, total)
			SELECT 'camp' || i, 'sharded', 4 FROM generate_series(1, $1::int) i
			RETURNING campaign
		)
		INSERT INTO pgquota.voucher_shard (campaign, shard, base, total)
		SELECT p.campaign, s, 2 * s, 2 FROM p, generate_series(0, 1) s`, campaigns); err != nil {
		b.Fatal(err)
	}
	for _, m := range []struct {
		name string
		cfg  quota.Config
	}{
		{"group", quota.Config{Grouping: quota.GroupAcrossCounters}},
		{"coalesce", quota.Config{Grouping: quota.GroupByCounter}},
		{"single", quota.Config{Grouping: quota.GroupNone}},
	} {
		b.Run(m.name, func(b *testing.B) {
			pool := pgtest.Connect(b, url, 16)
			client, err := quota.New(pool, &m.cfg)
			if err != nil {
				b.Fatal(err)
			}
			base := heapAfterGC()
			for pass := 1; pass <= 2; pass++ {
				prefix := fmt.Sprintf("%s-%d-", m.name, pass)
				runParallel(b, 256, counters, func(i int) error {
					_, err := client.Grant(ctx, quota.GrantRequest{Quota: "mem", Member: prefix + strconv.Itoa(i), Amount: 1})
					return err
				})
				runParallel(b, 64, campaigns, func(i int) error {
					_, err := voucherOf(b, client).Claim(ctx, voucher.ClaimRequest{Campaign: "camp" + strconv.Itoa(i+1), Member: prefix})
					return err
				})
				heap := heapAfterGC()
				b.ReportMetric(float64(int64(heap)-int64(base))/(1<<20), fmt.Sprintf("heap-MB-pass%d", pass))
			}
			runtime.KeepAlive(client)
		})
	}
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s: %q is not a positive count", name, s)
	}
	return n
}

// heapAfterGC returns the live heap after a full collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// runParallel runs op(0) .. op(n-1) on workers goroutines, failing b on
// the first error.
func runParallel(b *testing.B, workers, n int, op func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := op(i); err != nil {
					once.Do(func() { b.Error(err) })
					return
				}
			}
		}()
	}
	wg.Wait()
}
