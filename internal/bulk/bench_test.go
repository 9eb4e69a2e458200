package bulk_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgquota/pgquota/internal/bulk"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// BenchmarkRun measures bulk grants from a CSV file of 100,000 rows, each
// a distinct member: first grants (new counters, the insert path), then
// the same file again (existing counters, the update path), with durable
// commits (one per batch), for a few worker counts. It reports rows/s.
//
//	go test ./internal/bulk -run '^$' -bench Run -benchtime 3x
func BenchmarkRun(b *testing.B) {
	const rows = 100_000
	pool := pgtest.NewPool(b, 16)
	ctx := context.Background()
	var seq atomic.Int64
	for _, workers := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			client, err := quota.New(pool, nil)
			if err != nil {
				b.Fatal(err)
			}
			var insert, update float64
			for range b.N {
				name := fmt.Sprint("bulk-", seq.Add(1))
				if _, err := client.DefineQuota(ctx, quota.Definition{Name: name, Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)}); err != nil {
					b.Fatal(err)
				}
				var sb strings.Builder
				sb.WriteString("quota,member,amount\n")
				for i := range rows {
					fmt.Fprintf(&sb, "%s,member-%d,1\n", name, i)
				}
				file := sb.String()
				for pass := range 2 {
					r, err := bulk.NewReader(strings.NewReader(file))
					if err != nil {
						b.Fatal(err)
					}
					sum, err := bulk.Run(ctx, client, r.Next, bulk.Options{Workers: workers}, func(o bulk.Outcome) error {
						if o.Status != bulk.StatusGranted {
							return fmt.Errorf("line %d: %s %s", o.Line, o.Status, o.Error)
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
					if pass == 0 {
						insert += sum.RowsPerSec
					} else {
						update += sum.RowsPerSec
					}
				}
			}
			b.ReportMetric(insert/float64(b.N), "new-rows/s")
			b.ReportMetric(update/float64(b.N), "existing-rows/s")
		})
	}
}
