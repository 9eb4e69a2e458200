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

// The coordinator gets an immediate shutdown under grant and fenced-write
// load from two Clients over members and leases on both workers, and is
// started again (crash recovery; the prepared transactions it had
// recorded as committed are finished on the workers by
// recover_prepared_transactions()). Every counter holds at least the grants
// its callers were told succeeded and at most those plus the calls
// reported with an unknown outcome; no prepared transaction is left on a
// worker; the fence mark is at least the last acknowledged write's token
// and an older token is refused; the next lease's token is higher than
// every token issued before the crash.
func TestCitusCoordinatorCrashMidLoadKeepsLimitsAndTokens(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	newClient := func() *quota.Client {
		qc, err := quota.New(pgcluster.Pool(t, c.URL()), nil)
		require.NoError(t, err)
		return qc
	}
	clients := []*quota.Client{newClient(), newClient()}
	a := clients[0]
	_, err := a.DefineQuota(ctx, quota.Definition{Name: "load", Window: quota.WindowDay, DefaultLimit: quota.Limit(400)})
	require.NoError(t, err)
	var members []string
	for i, w := range c.Workers() {
		for j := range 4 {
			members = append(members, citusValueOn(t, c, "pgquota.usage", fmt.Sprintf("cc%d%d-", i, j), w.Port))
		}
	}

	type tally struct{ acked, unknown int }
	var (
		mu      sync.Mutex
		tallies = map[string]*tally{}
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		failed  atomic.Int64
	)
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
				m := members[(g*3+i)%len(members)]
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				res, err := clients[g%2].Grant(cctx, quota.GrantRequest{Quota: "load", Member: m, Amount: 1})
				cancel()
				mu.Lock()
				tl := tallies[m]
				if tl == nil {
					tl = &tally{}
					tallies[m] = tl
				}
				switch {
				case errors.Is(err, quota.ErrOutcomeUnknown):
					tl.unknown++
				case err != nil:
					failed.Add(1)
				case res.Granted:
					tl.acked++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	resource := citusValueOn(t, c, "pgquota.lease", "cjob", c.Workers()[1].Port)
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
				maxIssued.Store(max(maxIssued.Load(), l.Token))
				if _, err = fc.WriteRow(cctx, fence.WriteRowRequest{Resource: resource, Key: "state", Value: "v", Token: l.Token}); err == nil {
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
	c.Coordinator.Crash()
	time.Sleep(300 * time.Millisecond)
	c.Coordinator.Start()
	var recovered int
	c.Coordinator.QueryValue(cituscluster.Database, `SELECT recover_prepared_transactions()`, &recovered)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	for _, w := range c.Workers() {
		var prepared int
		w.QueryValue(cituscluster.Database, `SELECT count(*) FROM pg_prepared_xacts`, &prepared)
		require.Zero(t, prepared, "worker %d: no prepared transaction left", w.Port)
	}

	var acked, unknown int
	for _, m := range members {
		tl := tallies[m]
		require.NotNil(t, tl, m)
		u, err := a.Usage(ctx, "load", m)
		require.NoError(t, err)
		require.GreaterOrEqual(t, u.Used, int64(tl.acked), "%s: no acknowledged grant lost", m)
		require.LessOrEqual(t, u.Used, int64(tl.acked+tl.unknown), "%s: a call that failed without saying its outcome is unknown did not commit", m)
		require.LessOrEqual(t, u.Used, int64(400), m)
		acked += tl.acked
		unknown += tl.unknown
	}
	t.Logf("grants acknowledged %d, outcome unknown %d, failed %d; %d prepared transactions recovered", acked, unknown, failed.Load(), recovered)
	require.Positive(t, acked)
	require.Positive(t, unknown+int(failed.Load()), "the crash failed calls")

	require.Positive(t, lastWritten.Load())
	fc, err := fence.New(a)
	require.NoError(t, err)
	row, err := fc.Row(ctx, resource, "state")
	require.NoError(t, err)
	require.GreaterOrEqual(t, row.Token, lastWritten.Load())
	_, err = fc.WriteRow(ctx, fence.WriteRowRequest{Resource: resource, Key: "state", Value: "stale", Token: lastWritten.Load() - 1})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	lc, err := lease.New(a)
	require.NoError(t, err)
	var next lease.Lease
	require.Eventually(t, func() bool {
		next, err = lc.Acquire(ctx, lease.AcquireRequest{Name: resource, Holder: "after", TTL: time.Minute})
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "acquire after the restart")
	require.Greater(t, next.Token, maxIssued.Load(), "tokens stay increasing across the coordinator's crash")
}
