//go:build citus

package cli_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// A grant load and a fenced-writer load from two Clients (replicas, a pool
// each) run on a coordinator and two workers while a third worker is added
// and citus_rebalance_start() moves shards onto it. Nothing is granted
// above a limit: every counter equals the grants its callers were told
// succeeded (within the calls whose outcome was reported unknown), and no
// stale fencing token is admitted, before, during or after the moves.
// After the rebalance, counters and leases whose shards now live on the
// added worker are exact too (20 concurrent grants at a limit of 5 give 5;
// a stale token is refused).
func TestCitusRebalanceOntoAddedWorkerUnderLoadKeepsLimitsAndFences(t *testing.T) {
	c := cituscluster.StartWith(t, 2, pgcluster.Options{"citus.shard_count": "8"})
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()

	clients := citusClients(t, c, 2)
	a := clients[0]
	for _, d := range []quota.Definition{
		{Name: "day", Window: quota.WindowDay, DefaultLimit: quota.Limit(5)},
		{Name: "roll", Window: quota.WindowRolling, DefaultLimit: quota.Limit(5), Period: time.Hour},
	} {
		_, err := a.DefineQuota(ctx, d)
		require.NoError(t, err)
	}

	// The grant load: every call takes the next of a global sequence;
	// each (quota, member) gets about 12 calls, so grants and denials go
	// on throughout the run rather than only at its start.
	type outcome struct{ granted, unknown int }
	var (
		mu       sync.Mutex
		outcomes = map[string]*outcome{}
		failures []string
		calls    atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	record := func(key string, granted bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		o := outcomes[key]
		if o == nil {
			o = &outcome{}
			outcomes[key] = o
		}
		switch {
		case errors.Is(err, quota.ErrOutcomeUnknown):
			o.unknown++
		case err != nil:
			failures = append(failures, fmt.Sprintf("%s: %v", key, err))
		case granted:
			o.granted++
		}
	}
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			qc := clients[g%2]
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := calls.Add(1)
				q := []string{"day", "roll"}[n%2]
				m := "m" + strconv.FormatInt(n/24, 10)
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				res, err := qc.Grant(cctx, quota.GrantRequest{Quota: q, Member: m, Amount: 1})
				cancel()
				record(q+"/"+m, res.Granted, err)
			}
		}()
	}

	// The fenced writers: two Clients take turns on four resources; each
	// round acquires the lease, writes with its token, releases, and then
	// tries the previous round's (lower) token, which must be refused.
	var staleAdmitted, staleRefused, fenceRounds atomic.Int64
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lc, err := lease.New(clients[g])
			if err != nil {
				record("fence", false, err)
				return
			}
			fc, err := fence.New(clients[g])
			if err != nil {
				record("fence", false, err)
				return
			}
			last := map[string]int64{}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res := fmt.Sprintf("job-%d-%d", g, i%4)
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				l, err := lc.Acquire(cctx, lease.AcquireRequest{Name: res, Holder: "w" + strconv.Itoa(g), TTL: 30 * time.Second})
				if err == nil {
					_, err = fc.WriteRow(cctx, fence.WriteRowRequest{Resource: res, Key: "state", Value: strconv.Itoa(i), Token: l.Token})
				}
				if err == nil {
					_, err = lc.Release(cctx, l)
				}
				if err == nil && last[res] != 0 {
					_, serr := fc.WriteRow(cctx, fence.WriteRowRequest{Resource: res, Key: "state", Value: "stale", Token: last[res]})
					switch {
					case errors.Is(serr, fence.ErrStaleToken):
						staleRefused.Add(1)
					case serr == nil:
						staleAdmitted.Add(1)
					default:
						record("fence stale "+res, false, serr)
					}
				}
				cancel()
				if err != nil {
					record("fence "+res, false, err)
					continue
				}
				last[res] = l.Token
				fenceRounds.Add(1)
			}
		}()
	}

	time.Sleep(2 * time.Second)
	before := calls.Load()
	added := c.AddWorker()
	t.Logf("worker %d added after %d grant calls", added.Port, before)
	var jobID int64
	c.Coordinator.QueryValue(cituscluster.Database, "SELECT citus_rebalance_start()", &jobID)
	start := time.Now()
	var state string
	for {
		c.Coordinator.QueryValue(cituscluster.Database,
			"SELECT state::text FROM citus_rebalance_status() WHERE job_id = $1", &state, jobID)
		if state == "finished" || state == "failed" || state == "cancelled" || time.Since(start) > 5*time.Minute {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	during := calls.Load() - before
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	require.Equal(t, "finished", state, "rebalance job %d", jobID)
	t.Logf("rebalance took %s; %d grant calls during it, %d in all; %d fence rounds, %d stale writes refused",
		time.Since(start).Round(time.Millisecond), during, calls.Load(), fenceRounds.Load(), staleRefused.Load())

	var moved int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT count(*) FROM citus_shards
		WHERE nodeport = $1 AND table_name IN ('pgquota.usage'::regclass, 'pgquota.lease'::regclass)`, &moved, added.Port)
	require.Positive(t, moved, "the rebalance moved shards of usage and lease onto the added worker")
	require.Positive(t, during, "grants ran while the shards moved")

	require.Empty(t, failures, "every call succeeded or reported its outcome unknown")
	require.Zero(t, staleAdmitted.Load(), "no stale token admitted")
	require.Positive(t, staleRefused.Load())

	// Every counter holds exactly what its callers were told was granted,
	// give or take the calls whose outcome was reported unknown, and none
	// is above its limit.
	unknown := 0
	for key, o := range outcomes {
		q, m, isGrant := strings.Cut(key, "/")
		if !isGrant {
			continue // a fence outcome: its failures are in failures
		}
		u, err := a.Usage(ctx, q, m)
		require.NoError(t, err)
		require.LessOrEqual(t, u.Used, int64(5), key)
		require.GreaterOrEqual(t, u.Used, int64(o.granted), key)
		require.LessOrEqual(t, u.Used, int64(o.granted+o.unknown), key)
		unknown += o.unknown
	}
	t.Logf("%d counters checked, %d calls with an unknown outcome", len(outcomes), unknown)

	// After the moves: a member and a lease whose shards are on the added
	// worker.
	member := citusValueOn(t, c, "pgquota.usage", "after", added.Port)
	require.EqualValues(t, 5, grantRace(t, clients, "day", member), "20 concurrent grants at a limit of 5 on the added worker")
	u, err := a.Usage(ctx, "day", member)
	require.NoError(t, err)
	require.EqualValues(t, 5, u.Used)

	res := citusValueOn(t, c, "pgquota.lease", "moved-job", added.Port)
	lc, err := lease.New(a)
	require.NoError(t, err)
	fc, err := fence.New(clients[1])
	require.NoError(t, err)
	first, err := lc.Acquire(ctx, lease.AcquireRequest{Name: res, Holder: "one", TTL: time.Minute})
	require.NoError(t, err)
	_, err = lc.Release(ctx, first)
	require.NoError(t, err)
	second, err := lc.Acquire(ctx, lease.AcquireRequest{Name: res, Holder: "two", TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, second.Token, first.Token)
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: res, Key: "k", Value: "new", Token: second.Token})
	require.NoError(t, err)
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: res, Key: "k", Value: "old", Token: first.Token})
	require.ErrorIs(t, err, fence.ErrStaleToken)
}
