package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// spreadMembers is how many counters the spread case grants to.
const spreadMembers = 10000

// BenchmarkGrant measures Grant with N concurrent clients, each a goroutine,
// on a pool of exactly N connections: on one hot counter row, and spread
// over 10,000 existing counters. It reports grants/s and allocs/op. The
// limit is far above what a run uses, so every call is a full grant. The
// -pgx cases send the same generated statement through pgx alone, so the
// two side by side show what the library costs over its driver.
//
//	go test ./quota -run '^$' -bench Grant -benchtime 3s
//
// `make bench-compare` runs the same statement through pgbench beside it.
func BenchmarkGrant(b *testing.B) {
	url, members := benchDB(b)
	hot := func(*rand.Rand) string { return "hot" }
	spread := func(rng *rand.Rand) string { return members[rng.IntN(len(members))] }
	cases := []struct {
		name   string
		member func(rng *rand.Rand) string
		grant  grantFunc
	}{
		{"hot-row", hot, libraryGrant},
		{"spread", spread, libraryGrant},
		// The same statement through pgx alone, without the library's
		// validation, retry wrapper and result mapping: the baseline that
		// shows what pgquota adds over its driver.
		{"hot-row-pgx", hot, pgxGrant},
		{"spread-pgx", spread, pgxGrant},
	}
	for _, c := range cases {
		for _, clients := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/clients=%d", c.name, clients), func(b *testing.B) {
				benchGrant(b, url, clients, c.member, c.grant)
			})
		}
	}
}

// benchDB creates a migrated database with the day quota "bench" (no
// default limit) and spreadMembers counters of it in the current window,
// at 0, and returns its URL and the members.
func benchDB(b *testing.B) (string, []string) {
	ctx := context.Background()
	url := pgtest.NewURL(b)
	setupPool := pgtest.ConnectOperator(b, url, 2)
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
	// The spread counters exist before the clock starts: the case measures
	// the update path, not first grants.
	if _, err := pgtest.ConnectOwner(b, url, 1).Exec(ctx, `
		INSERT INTO pgquota.usage (quota_name, member, window_start, window_end, used)
		SELECT 'bench', m, pgquota.window_start('day', 'UTC', pgquota.clock()),
		       pgquota.window_end('day', 'UTC', pgquota.clock()), 0
		FROM unnest($1::text[]) AS m`, members); err != nil {
		b.Fatal(err)
	}
	return url, members
}

// grantFunc grants one unit of the bench quota to member and reports
// whether it was granted.
type grantFunc func(ctx context.Context, client *quota.Client, pool *pgxpool.Pool, member string) (bool, error)

func libraryGrant(ctx context.Context, client *quota.Client, _ *pgxpool.Pool, member string) (bool, error) {
	limit := quota.MaxUnits
	res, err := client.Grant(ctx, quota.GrantRequest{Quota: "bench", Member: member, Amount: 1, Limit: &limit})
	return res.Granted, err
}

var queries = db.New()

func pgxGrant(ctx context.Context, _ *quota.Client, pool *pgxpool.Pool, member string) (bool, error) {
	row, err := queries.UsageGrant(ctx, pool, db.UsageGrantParams{
		Member: member, QuotaName: "bench", Amount: 1,
		LimitValue: pgtype.Int8{Int64: quota.MaxUnits, Valid: true},
	})
	return row.Granted, err
}

func benchGrant(b *testing.B, url string, clients int, member func(*rand.Rand) string, grant grantFunc) {
	ctx := context.Background()
	pool := pgtest.Connect(b, url, int32(clients))
	// Connect all N before the clock starts.
	conns := make([]interface{ Release() }, 0, clients)
	for range clients {
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	client, err := quota.New(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var (
		next    atomic.Int64
		denied  atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
	)
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for next.Add(1) <= int64(b.N) {
				granted, err := grant(ctx, client, pool, member(rng))
				if err != nil {
					errOnce.Do(func() { b.Error(err) })
					return
				}
				if !granted {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if n := denied.Load(); n > 0 {
		b.Errorf("%d grants denied: the benchmark should only measure grants", n)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
}
