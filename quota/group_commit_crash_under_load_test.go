package quota_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// groupCounterKey is a counter of the group commit crash test.
type groupCounterKey struct{ quota, member string }

// groupAccount is what the calls on one counter reported, in units.
type groupAccount struct {
	granted   int64 // reported granted, by the call or by Config.OnAbandonedGrant
	unknown   int64 // of unknown outcome: the call's error, or the abandoned outcome's
	abandoned int64 // calls that returned ErrGrantAbandoned
	hooked    int64 // abandoned calls whose outcome reached OnAbandonedGrant
}

// TestGroupedAndCoalescedGrantsSurviveImmediateShutdownUnderLoad proves
// that grants through Config.GroupCommit and Config.Coalesce survive an
// immediate shutdown that hits them in flight: 24 goroutines grant through
// four Clients (two of each), on eight counters and one hot counter with a
// limit, a quarter of the calls with a deadline of a few milliseconds (so
// calls are abandoned after their group was sent). Each call either
// reported an outcome, or returned an error that wraps ErrOutcomeUnknown
// (ErrGrantAbandoned among them, whose outcome then reaches
// Config.OnAbandonedGrant) or that clearly sent nothing. After the restart,
// before any new call, and at the end, every counter holds at least the
// units reported granted (by the call or the hook) and at most those plus
// the units of unknown outcome; the hot counter never passes its limit.
// The rounds alternate between synchronous_commit on and off for the role.
func TestGroupedAndCoalescedGrantsSurviveImmediateShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cl, targets := newCrashCluster(t, "groupcrash")
	const (
		workers = 24
		hotCap  = 400
	)
	for round := range crashRounds(t, 2) {
		tg := targets[round%len(targets)]
		spread, capped := fmt.Sprintf("spread-%d", round), fmt.Sprintf("capped-%d", round)
		admin, closeAdmin := crashClient(t, cl.URL(tg.Database))
		_, err := admin.DefineQuota(ctx, quota.Definition{Name: spread, Window: quota.WindowNone, DefaultLimit: ptr[int64](1 << 40)})
		require.NoError(t, err)
		_, err = admin.DefineQuota(ctx, quota.Definition{Name: capped, Window: quota.WindowNone, DefaultLimit: ptr[int64](hotCap)})
		require.NoError(t, err)
		closeAdmin()
		cl.Exec(tg.Database, "CHECKPOINT")

		var mu sync.Mutex
		accounts := map[groupCounterKey]*groupAccount{}
		account := func(q, m string) *groupAccount { // under mu
			k := groupCounterKey{q, m}
			if accounts[k] == nil {
				accounts[k] = &groupAccount{}
			}
			return accounts[k]
		}
		load := newCrashLoad(t)
		onAbandoned := func(req quota.GrantRequest, res quota.GrantResult, err error) {
			unknown := err != nil && load.Failed(fmt.Sprintf("abandoned grant of %d on %s/%s", req.Amount, req.Quota, req.Member), err)
			mu.Lock()
			defer mu.Unlock()
			a := account(req.Quota, req.Member)
			a.hooked += req.Amount
			switch {
			case unknown:
				a.unknown += req.Amount
			case err == nil && res.Granted:
				a.granted += req.Amount
			}
		}
		var groups, batches int // statements deciding more than one call
		var clients []*quota.Client
		var closers []func()
		for i := range 4 {
			cfg := &quota.Config{GroupCommit: i%2 == 0, Coalesce: i%2 == 1, OnAbandonedGrant: onAbandoned}
			c, closePool := crashLoadPool(t, tg.URL, 6, cfg)
			requireSynchronousCommit(t, c, tg)
			if cfg.GroupCommit {
				quota.SetGroupSend(c, func(reqs []quota.GrantRequest) {
					if len(reqs) > 1 {
						mu.Lock()
						groups++
						mu.Unlock()
					}
				})
			} else {
				quota.SetCoalesceSend(c, func(n int) {
					if n > 1 {
						mu.Lock()
						batches++
						mu.Unlock()
					}
				})
			}
			clients = append(clients, c)
			closers = append(closers, closePool)
		}

		calls := make([]int, workers)
		load.Start(workers, func(w int) {
			calls[w]++
			req := quota.GrantRequest{Quota: spread, Member: fmt.Sprintf("m%d", w%8), Amount: int64(1 + w%2)}
			if w%3 == 0 {
				req.Quota, req.Member = capped, "hot"
			}
			callCtx := ctx
			if calls[w]%4 == 0 {
				var cancel context.CancelFunc
				callCtx, cancel = context.WithTimeout(ctx, time.Duration(1+calls[w]%15)*time.Millisecond)
				defer cancel()
			}
			res, err := clients[w%4].Grant(callCtx, req)
			if err != nil {
				unknown := load.Failed(fmt.Sprintf("grant of %d on %s/%s", req.Amount, req.Quota, req.Member), err, context.DeadlineExceeded)
				mu.Lock()
				a := account(req.Quota, req.Member)
				switch {
				case errors.Is(err, quota.ErrGrantAbandoned):
					a.abandoned += req.Amount
				case unknown:
					a.unknown += req.Amount
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				return
			}
			if res.Granted {
				mu.Lock()
				account(req.Quota, req.Member).granted += req.Amount
				mu.Unlock()
			}
		})
		time.Sleep(1200 * time.Millisecond)
		load.Crash(cl)

		// checkCounters reads every counter: at least the units reported
		// granted, at most those plus the units of unknown outcome (and of
		// abandoned calls whose outcome has not reached the hook yet).
		checkCounters := func(when string) (granted, unknown int64) {
			check, closeCheck := crashClient(t, cl.URL(tg.Database))
			defer closeCheck()
			mu.Lock()
			defer mu.Unlock()
			for k, a := range accounts {
				u, err := check.Usage(ctx, k.quota, k.member)
				require.NoError(t, err)
				require.GreaterOrEqual(t, u.Used, a.granted, "%s: counter %s/%s lost units reported granted", when, k.quota, k.member)
				require.LessOrEqual(t, u.Used, a.granted+a.unknown+a.abandoned-a.hooked,
					"%s: counter %s/%s holds more than the %d units reported granted plus the %d of unknown outcome (%d abandoned, %d of them reported)",
					when, k.quota, k.member, a.granted, a.unknown, a.abandoned, a.hooked)
				if k.quota == capped {
					require.LessOrEqual(t, u.Used, int64(hotCap), "%s: the hot counter passed its limit", when)
				}
				granted += a.granted
				unknown += a.unknown + a.abandoned - a.hooked
			}
			return granted, unknown
		}
		grantedBefore, unknownBefore := checkCounters("after the restart")
		require.Positive(t, grantedBefore, "round %d: nothing granted before the crash", round)

		load.Resume()
		time.Sleep(1200 * time.Millisecond)
		load.Stop()
		// Every abandoned call's outcome reaches the hook once its
		// statement returns.
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, a := range accounts {
				if a.hooked != a.abandoned {
					return false
				}
			}
			return true
		}, 30*time.Second, 10*time.Millisecond, "abandoned calls whose outcome never reached OnAbandonedGrant")
		for _, c := range closers {
			c()
		}
		granted, unknown := checkCounters("at the end")
		require.Greater(t, granted, grantedBefore, "round %d: nothing granted after the restart", round)
		mu.Lock()
		require.Positive(t, groups, "no group of several calls was sent")
		require.Positive(t, batches, "no coalesced statement of several calls was sent")
		var abandoned int64
		for _, a := range accounts {
			abandoned += a.abandoned
		}
		mu.Unlock()
		unknownErrs, preSend := load.ErrorCounts()
		require.Positive(t, unknownErrs+preSend, "round %d: no call noticed the crash", round)
		t.Logf("round %d (%s): %d units granted (%d before the crash, %d units then of unknown outcome), %d units of unknown outcome, "+
			"%d units abandoned; %d groups and %d coalesced statements of several calls; crash and restart took %s; "+
			"%d errors of unknown outcome, %d clear errors before sending",
			round, tg.What, granted, grantedBefore, unknownBefore, unknown, abandoned, groups, batches,
			load.CrashDur.Round(time.Millisecond), unknownErrs, preSend)
	}
}
