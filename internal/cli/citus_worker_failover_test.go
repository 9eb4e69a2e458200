//go:build citus

package cli_test

import (
	"context"
	"errors"
	"fmt"
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

// A worker with a synchronous streaming standby crashes (immediate
// shutdown) under grant and fenced-write load from two Clients; the
// standby is promoted and put in its place (citus_update_node), and the
// coordinator finishes the two-phase commits the worker was in the middle
// of (recover_prepared_transactions()). Tokens and
// their epoch come from the coordinator, so the failover changes nothing
// about them; what lives on the worker survives because every commit
// there waited for the standby: no counter holds fewer units than its
// callers were told were granted, none is above its limit, no counter
// holds more than that plus the calls reported with an unknown outcome
// (a call that failed otherwise did not commit), the
// fence mark is at least the last token whose write was acknowledged (an
// older token is refused), the next lease gets a higher token than any
// before, and 20 concurrent grants at a limit of 5 on the promoted worker
// give 5.
func TestCitusWorkerFailoverToSynchronousStandbyKeepsLimitsAndFences(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	w := c.Workers()[0]
	standby := w.NewStandby("citus-worker1-standby")
	w.Exec("postgres", `ALTER SYSTEM SET synchronous_standby_names = '*'`)
	w.Exec("postgres", `SELECT pg_reload_conf()`)
	require.Eventually(t, func() bool {
		var state string
		w.QueryValue("postgres", `SELECT coalesce(max(sync_state), '') FROM pg_stat_replication`, &state)
		return state == "sync"
	}, 30*time.Second, 50*time.Millisecond, "the standby became synchronous")

	newClient := func() *quota.Client {
		qc, err := quota.New(pgcluster.Pool(t, c.URL()), nil)
		require.NoError(t, err)
		return qc
	}
	clients := []*quota.Client{newClient(), newClient()}
	a := clients[0]
	for _, d := range []quota.Definition{
		{Name: "load", Window: quota.WindowDay, DefaultLimit: quota.Limit(400)},
		{Name: "after", Window: quota.WindowDay, DefaultLimit: quota.Limit(5)},
	} {
		_, err := a.DefineQuota(ctx, d)
		require.NoError(t, err)
	}
	var members []string
	for i := range 6 {
		members = append(members, citusValueOn(t, c, "pgquota.usage", fmt.Sprintf("fo%d-", i), w.Port))
	}
	resource := citusValueOn(t, c, "pgquota.lease", "job", w.Port)

	type tally struct {
		acked, unknown, failed int
		used                   []int64 // GrantResult.Used of the acknowledged grants
		at                     []time.Time
	}
	var (
		mu       sync.Mutex
		tallies  = map[string]*tally{}
		failures []string
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	count := func(m string, res quota.GrantResult, err error) {
		granted := res.Granted
		mu.Lock()
		defer mu.Unlock()
		tl := tallies[m]
		if tl == nil {
			tl = &tally{}
			tallies[m] = tl
		}
		switch {
		case errors.Is(err, quota.ErrOutcomeUnknown):
			tl.unknown++
		case err != nil:
			tl.failed++
			if len(failures) < 5 {
				failures = append(failures, err.Error())
			}
		case granted:
			tl.acked++
			tl.used = append(tl.used, res.Used)
			tl.at = append(tl.at, time.Now())
		}
	}
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := members[(g+i)%len(members)]
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				res, err := clients[g%2].Grant(cctx, quota.GrantRequest{Quota: "load", Member: m, Amount: 1})
				cancel()
				count(m, res, err)
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	var lastWritten, maxIssued atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		lc, _ := lease.New(clients[1])
		fc, _ := fence.New(clients[1])
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			l, err := lc.Acquire(cctx, lease.AcquireRequest{Name: resource, Holder: "writer", TTL: 2 * time.Second})
			if err == nil {
				if l.Token > maxIssued.Load() {
					maxIssued.Store(l.Token)
				}
				_, err = fc.WriteRow(cctx, fence.WriteRowRequest{Resource: resource, Key: "state", Value: fmt.Sprint(l.Token), Token: l.Token})
				if err == nil {
					lastWritten.Store(l.Token)
				}
				_, _ = lc.Release(cctx, l)
			}
			cancel()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()

	time.Sleep(1500 * time.Millisecond)
	crashAt := time.Now()
	w.Crash()
	t.Logf("worker %d crashed at %s", w.Port, crashAt.Format("15:04:05.000000"))
	time.Sleep(500 * time.Millisecond)
	standby.Promote()
	c.Coordinator.Exec(cituscluster.Database, fmt.Sprintf(
		`SELECT citus_update_node(nodeid, '127.0.0.1', %d) FROM pg_dist_node WHERE nodeport = %d`, standby.Port, w.Port))
	// Grants that wrote several shards committed with two-phase commit:
	// the coordinator recorded the commit, and a COMMIT PREPARED the
	// crashed worker never ran is still prepared on the promoted standby,
	// holding its counters' row locks, until Citus's recovery finishes it
	// (the maintenance daemon does every citus.recover_2pc_interval, 1 min
	// by default): run it now, as the failover procedure says.
	var recovered int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT recover_prepared_transactions()`, &recovered)
	t.Logf("recover_prepared_transactions() finished %d prepared transactions", recovered)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	var prepared int
	standby.QueryValue(cituscluster.Database, `SELECT count(*) FROM pg_prepared_xacts`, &prepared)
	require.Zero(t, prepared, "no prepared transaction left on the promoted worker")

	total := tally{}
	for _, m := range members {
		tl := tallies[m]
		require.NotNil(t, tl, m)
		u, err := a.Usage(ctx, "load", m)
		require.NoError(t, err)
		require.LessOrEqual(t, u.Used, int64(400), m)
		if u.Used < int64(tl.acked) {
			for i := range tl.used {
				t.Logf("%s: acknowledged grant %d: used %d at %s", m, i, tl.used[i], tl.at[i].Format("15:04:05.000000"))
			}
		}
		require.GreaterOrEqual(t, u.Used, int64(tl.acked), "%s: no acknowledged grant lost", m)
		require.LessOrEqual(t, u.Used, int64(tl.acked+tl.unknown), "%s: a call that failed without saying its outcome is unknown did not commit", m)
		total.acked += tl.acked
		total.unknown += tl.unknown
		total.failed += tl.failed
		t.Logf("%s: used %d, acknowledged %d, outcome unknown %d, failed %d", m, u.Used, tl.acked, tl.unknown, tl.failed)
	}
	t.Logf("grants acknowledged %d, outcome unknown %d, failed %d; first failures: %q", total.acked, total.unknown, total.failed, failures)
	require.Positive(t, total.acked)

	require.Positive(t, lastWritten.Load(), "fenced writes were acknowledged")
	fc, err := fence.New(a)
	require.NoError(t, err)
	row, err := fc.Row(ctx, resource, "state")
	require.NoError(t, err)
	require.GreaterOrEqual(t, row.Token, lastWritten.Load(), "the fence mark survived the failover")
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: resource, Key: "state", Value: "stale", Token: lastWritten.Load() - 1})
	require.ErrorIs(t, err, fence.ErrStaleToken)

	lc, err := lease.New(a)
	require.NoError(t, err)
	// The writer's last lease may still be held (its release can have
	// failed in the crash): it expires within its 2 s TTL.
	var next lease.Lease
	require.Eventually(t, func() bool {
		next, err = lc.Acquire(ctx, lease.AcquireRequest{Name: resource, Holder: "after", TTL: time.Minute})
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "acquire after the failover")
	require.Greater(t, next.Token, maxIssued.Load(), "tokens stay increasing across the worker's failover")

	member := citusValueOn(t, c, "pgquota.usage", "after", standby.Port)
	var granted atomic.Int64
	var gw sync.WaitGroup
	for i := range 20 {
		gw.Add(1)
		go func() {
			defer gw.Done()
			res, err := clients[i%2].Grant(ctx, quota.GrantRequest{Quota: "after", Member: member, Amount: 1})
			if err != nil {
				t.Errorf("grant %d: %v", i, err)
			}
			if res.Granted {
				granted.Add(1)
			}
		}()
	}
	gw.Wait()
	require.EqualValues(t, 5, granted.Load(), "on the promoted worker")
}
