package quota_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// Batched and coalesced grants of several callers on one counter: each
// request gets an answer (granted or denied, never an error), the answers
// are those of running the requests one after another in some order
// (checkChain), and the counter equals the units granted, at most the
// limit. The counter's row is contended all the time, so nearly every
// statement waits for another's row lock and decides on the version it
// waited for.

// sharedCounterCase is one run: callers goroutines, each making calls
// calls; limit is well above or below calls*callers.
type sharedCounterCase struct {
	name           string
	callers, calls int
	limit          int64
}

func sharedCounterCases(perCaller func(callers int) int) []sharedCounterCase {
	var cs []sharedCounterCase
	for _, callers := range []int{2, 8, 32} {
		calls := perCaller(callers)
		total := int64(callers * calls)
		cs = append(cs,
			sharedCounterCase{fmt.Sprintf("%d callers, room for all", callers), callers, calls, 10 * total},
			sharedCounterCase{fmt.Sprintf("%d callers, limit reached mid-run", callers), callers, calls, total / 2},
		)
	}
	return cs
}

// checkSharedCounter checks the answers of one run on counter (q, member).
func checkSharedCounter(t *testing.T, b *testBundle, member string, limit int64, results []quota.GrantResult, errs []error) {
	t.Helper()
	t.Logf("%s: %d of %d requests failed", t.Name(), len(errs), len(errs)+len(results))
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests failed instead of getting an answer, first: %v", len(errs), len(errs)+len(results), errs[0])
	}
	sum, _ := b.usageRows(t, "q", member)
	require.LessOrEqual(t, sum, limit)
	checkChain(t, results, sum)
}

func TestGrantBatchOneRequestSharedCounter(t *testing.T) {
	t.Parallel()
	for _, tc := range sharedCounterCases(func(callers int) int { return max(400/callers, 12) }) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, int32(min(tc.callers, 16)))
			b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(tc.limit)})
			var mu sync.Mutex
			var results []quota.GrantResult
			var errs []error
			concurrently(tc.callers, func(int) {
				for range tc.calls {
					outs, err := b.client.GrantBatch(b.ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1}})
					mu.Lock()
					switch {
					case err != nil:
						errs = append(errs, err)
					case outs[0].Err != nil:
						errs = append(errs, outs[0].Err)
					default:
						results = append(results, outs[0].GrantResult)
					}
					mu.Unlock()
				}
			})
			checkSharedCounter(t, b, "m", tc.limit, results, errs)
			require.Len(t, results, tc.callers*tc.calls)
		})
	}
}

func TestCoalesceClientsSharedCounter(t *testing.T) {
	t.Parallel()
	for _, clients := range []int{2, 4} {
		for _, roomForAll := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d clients, room for all %v", clients, roomForAll), func(t *testing.T) {
				t.Parallel()
				// Each client is one replica of a service with
				// Config.Coalesce, with its callers on the same hot
				// counter as the other replicas'.
				const callersPerClient, calls = 16, 25
				total := int64(clients * callersPerClient * calls)
				limit := 10 * total
				if !roomForAll {
					limit = total / 2
				}
				b := setup(t, 8)
				b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(limit)})
				cs := make([]*quota.Client, clients)
				for i := range cs {
					cs[i] = b.coalescing(t, quota.Config{})
				}
				var mu sync.Mutex
				var results []quota.GrantResult
				var errs []error
				concurrently(clients*callersPerClient, func(i int) {
					c := cs[i%clients]
					for range calls {
						res, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
						} else {
							results = append(results, res)
						}
						mu.Unlock()
					}
				})
				checkSharedCounter(t, b, "m", limit, results, errs)
				require.Len(t, results, int(total))
			})
		}
	}
}
