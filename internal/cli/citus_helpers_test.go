//go:build citus

package cli_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// citusValueOn returns the first of prefix0, prefix1, ... whose shard of
// the distributed table is placed on the worker listening on port, as the
// coordinator's metadata says.
func citusValueOn(t *testing.T, c *cituscluster.Cluster, table, prefix string, port int) string {
	t.Helper()
	for i := range 1000 {
		v := prefix + strconv.Itoa(i)
		var p int
		c.Coordinator.QueryValue(cituscluster.Database, `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column($1::regclass, $2::text)`, &p, table, v)
		if p == port {
			return v
		}
	}
	t.Fatalf("no %s value with prefix %q on the worker at port %d", table, prefix, port)
	return ""
}

// citusLoad is a grant load (4 goroutines over two Clients, one unit per
// call on members in turn, quota q) and a fenced writer (a lease on
// resource with a 2 s TTL, a fenced write with its token, a release, over
// and over), for the crash and failover tests. finish stops both; the
// checks then compare the database with what the callers were told.
type citusLoad struct {
	q, resource string
	members     []string

	mu       sync.Mutex
	tallies  map[string]*loadTally
	failures []string // the first few errors that were not ErrOutcomeUnknown

	lastWritten, maxIssued atomic.Int64
	stop                   chan struct{}
	wg                     sync.WaitGroup
}

// loadTally is what the callers of one member's grants were told.
type loadTally struct{ acked, unknown, failed int }

func startCitusLoad(ctx context.Context, clients []*quota.Client, q string, members []string, resource string) *citusLoad {
	l := &citusLoad{q: q, resource: resource, members: members, tallies: map[string]*loadTally{}, stop: make(chan struct{})}
	for _, m := range members {
		l.tallies[m] = &loadTally{}
	}
	for g := range 4 {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				m := members[(g*3+i)%len(members)]
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				res, err := clients[g%2].Grant(cctx, quota.GrantRequest{Quota: q, Member: m, Amount: 1})
				cancel()
				l.count(m, res.Granted, err)
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		lc, _ := lease.New(clients[1])
		fc, _ := fence.New(clients[1])
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			ls, err := lc.Acquire(cctx, lease.AcquireRequest{Name: resource, Holder: "writer", TTL: 2 * time.Second})
			if err == nil {
				l.maxIssued.Store(max(l.maxIssued.Load(), ls.Token))
				if _, err = fc.WriteRow(cctx, fence.WriteRowRequest{Resource: resource, Key: "state", Value: "v", Token: ls.Token}); err == nil {
					l.lastWritten.Store(ls.Token)
				}
				_, _ = lc.Release(cctx, ls)
			}
			cancel()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	return l
}

func (l *citusLoad) count(m string, granted bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tl := l.tallies[m]
	switch {
	case errors.Is(err, quota.ErrOutcomeUnknown):
		tl.unknown++
	case err != nil:
		tl.failed++
		if len(l.failures) < 5 {
			l.failures = append(l.failures, err.Error())
		}
	case granted:
		tl.acked++
	}
}

func (l *citusLoad) finish() {
	close(l.stop)
	l.wg.Wait()
}

// checkCounters requires every member's counter to hold at least the
// grants its callers were told succeeded, at most those plus the calls
// reported with an unknown outcome (a call that failed otherwise did not
// commit), and at most limit; it returns the totals.
func (l *citusLoad) checkCounters(t *testing.T, a *quota.Client, limit int64) (total loadTally) {
	t.Helper()
	for _, m := range l.members {
		tl := l.tallies[m]
		u, err := a.Usage(t.Context(), l.q, m)
		require.NoError(t, err)
		require.GreaterOrEqual(t, u.Used, int64(tl.acked), "%s: no acknowledged grant lost", m)
		require.LessOrEqual(t, u.Used, int64(tl.acked+tl.unknown), "%s: a call that failed without saying its outcome is unknown did not commit", m)
		require.LessOrEqual(t, u.Used, limit, m)
		total.acked += tl.acked
		total.unknown += tl.unknown
		total.failed += tl.failed
	}
	t.Logf("grants acknowledged %d, outcome unknown %d, failed %d; first failures: %q", total.acked, total.unknown, total.failed, l.failures)
	require.Positive(t, total.acked)
	require.Positive(t, total.unknown+total.failed, "the fault failed calls")
	return total
}

// checkFence requires the fence mark to be at least the last token whose
// write was acknowledged, an older token to be refused, and the next
// lease (once the writer's last one expired) to get a token above every
// one issued during the load.
func (l *citusLoad) checkFence(t *testing.T, a *quota.Client) {
	t.Helper()
	ctx := t.Context()
	require.Positive(t, l.lastWritten.Load(), "fenced writes were acknowledged")
	fc, err := fence.New(a)
	require.NoError(t, err)
	row, err := fc.Row(ctx, l.resource, "state")
	require.NoError(t, err)
	require.GreaterOrEqual(t, row.Token, l.lastWritten.Load(), "the fence mark survived")
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: l.resource, Key: "state", Value: "stale", Token: l.lastWritten.Load() - 1})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	lc, err := lease.New(a)
	require.NoError(t, err)
	var next lease.Lease
	require.Eventually(t, func() bool {
		next, err = lc.Acquire(ctx, lease.AcquireRequest{Name: l.resource, Holder: "after", TTL: time.Minute})
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "acquire after the fault (the writer's last lease expires within its 2 s TTL)")
	require.Greater(t, next.Token, l.maxIssued.Load(), "tokens stay increasing across the fault")
}

// grantRace runs 20 concurrent grants of one unit of q to member, in turn
// on clients, and returns how many were granted.
func grantRace(t *testing.T, clients []*quota.Client, q, member string) int64 {
	t.Helper()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := clients[i%len(clients)].Grant(t.Context(), quota.GrantRequest{Quota: q, Member: member, Amount: 1})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
			}
			if res.Granted {
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	return granted.Load()
}

// citusClients returns n Clients (replicas) on the coordinator, each on a
// pool of its own, with the default Config.
func citusClients(t *testing.T, c *cituscluster.Cluster, n int) []*quota.Client {
	t.Helper()
	var clients []*quota.Client
	for range n {
		qc, err := quota.New(pgcluster.Pool(t, c.URL()), nil)
		require.NoError(t, err)
		clients = append(clients, qc)
	}
	return clients
}
