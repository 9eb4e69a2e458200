package bulk_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/bulk"
)

// An interrupted run (its context ends mid-run) accounts for every row:
// the batches in flight still commit and report their rows, the rows after
// them are not run, and the granted rows are exactly the counters' units.
func TestRunInterruptedAccountsForEveryRow(t *testing.T) {
	t.Parallel()
	const rows = 20_000
	c, pool := setup(t, 4)
	var sb strings.Builder
	sb.WriteString("quota,member,amount\n")
	for i := range rows {
		fmt.Fprintf(&sb, "big,m%d,1\n", i%2000)
	}
	r, err := bulk.NewReader(strings.NewReader(sb.String()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []bulk.Outcome
	sum, err := bulk.Run(ctx, c, r.Next, bulk.Options{BatchSize: 250, Workers: 3}, func(o bulk.Outcome) error {
		got = append(got, o)
		if len(got) == 2000 {
			cancel() // the interrupt, with batches in flight
		}
		return nil
	})
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, sum.Interrupted)
	require.Len(t, got, rows, "every row has an outcome")
	counts := map[string]int64{}
	for i, o := range got {
		require.Equal(t, i+2, o.Line, "file order")
		counts[o.Status]++
	}
	require.Equal(t, map[string]int64{bulk.StatusGranted: sum.Granted, bulk.StatusNotRun: sum.NotRun}, counts,
		"granted or not run: in-flight batches were decided, none unknown")
	require.Positive(t, sum.NotRun)
	require.GreaterOrEqual(t, sum.Granted, int64(2000))
	require.Equal(t, sum.Granted, sum.Unkeyed)
	var units int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(sum(used), 0) FROM pgquota.usage`).Scan(&units))
	require.Equal(t, sum.Granted, units, "the summary matches the counters")
	t.Logf("interrupted after %d rows emitted: %d granted, %d not run", 2000, sum.Granted, sum.NotRun)
}
