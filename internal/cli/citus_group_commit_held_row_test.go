//go:build citus

package cli_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/quota"
)

// On a Citus coordinator, an application transaction that holds one
// counter's row (GrantTx, not committed) stalls only that counter's calls:
// rounds of 20 concurrent grants of other members through the default
// Config (group commit), racing a grant of the held counter that groups
// with them, are all decided while the row is still held; once the
// application commits, the held counter's call is granted and every
// counter is exact.
func TestCitusGroupCommitHeldRowStallsOnlyItsCounter(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	qc, err := quota.New(c.Pool(), nil)
	require.NoError(t, err)
	for _, d := range []quota.Definition{
		quota.CalendarWindow("q", quota.WindowNone, "", 1000),
		quota.Rate("r", 1000, time.Hour, 1000),
	} {
		_, err := qc.DefineQuota(ctx, d)
		require.NoError(t, err)
	}
	for _, q := range []string{"q", "r"} {
		t.Run(q, func(t *testing.T) {
			_, err := qc.Grant(ctx, quota.GrantRequest{Quota: q, Member: "held", Amount: 1})
			require.NoError(t, err)
			tx, err := c.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = qc.GrantTx(ctx, tx, quota.GrantRequest{Quota: q, Member: "held", Amount: 1})
			require.NoError(t, err)

			heldDone := make(chan error, 5)
			for round := range 5 {
				go func() {
					_, err := qc.Grant(ctx, quota.GrantRequest{Quota: q, Member: "held", Amount: 1})
					heldDone <- err
				}()
				var wg sync.WaitGroup
				errs := make(chan error, 20)
				for i := range 20 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res, err := qc.Grant(ctx, quota.GrantRequest{Quota: q, Member: fmt.Sprintf("m%d-%d", round, i), Amount: 1})
						if err == nil && !res.Granted {
							err = fmt.Errorf("denied")
						}
						errs <- err
					}()
				}
				finished := make(chan struct{})
				go func() { wg.Wait(); close(finished) }()
				select {
				case <-finished:
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d: grants of other counters stalled behind the held row", round)
				}
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
			}
			select {
			case err := <-heldDone:
				t.Fatalf("a grant of the held counter finished while the row was held: %v", err)
			default:
			}
			require.NoError(t, tx.Commit(ctx))
			for range 5 {
				select {
				case err := <-heldDone:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("the held counter's grants did not finish after the commit")
				}
			}
			u, err := qc.Usage(ctx, q, "held")
			require.NoError(t, err)
			require.EqualValues(t, 7, u.Used, "1 before, 1 in the application's transaction, 5 after")
			u, err = qc.Usage(ctx, q, "m4-19")
			require.NoError(t, err)
			require.EqualValues(t, 1, u.Used)
		})
	}
}
