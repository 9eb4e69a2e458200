package lease_test

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// slotHold is one acquisition of a slot that AcquireSlot reported.
type slotHold struct {
	slot        lease.Slot
	releaseSent time.Time // when its holder first sent a release that may have reached the server; zero if never
}

// end is when the holder stopped holding by what the API told it: at its
// expiry, or earlier when it sent a release.
func (h *slotHold) end() time.Time {
	if !h.releaseSent.IsZero() && h.releaseSent.Before(h.slot.ExpiresAt) {
		return h.releaseSent
	}
	return h.slot.ExpiresAt
}

// TestSemaphoreLimitAndTokensSurviveImmediateShutdownUnderLoad proves that
// a semaphore of 3 keeps its limit and its fencing across an immediate
// shutdown that hits 20 acquirers on two Clients (replicas), each taking a
// slot, writing under it (a fenced write naming the slot's lease) and
// releasing it. Never more than 3 hold: no acquire reports more than 3
// holders or a slot beyond the third, a sampler reading the semaphore
// (Semaphore and the slot lease rows) never sees more, and the intervals
// the API reported as held (acquired at, to the release sent or the
// expiry) never overlap more than 3 deep. The slots held at the crash are
// held after the restart with their tokens, no token is issued twice, every
// slot acquired after the restart has a larger token than any issued
// before the crash, and a fenced write with a pre-crash token of a slot
// that was acquired again after the restart is refused (ErrStaleToken; with
// the lease named, ErrLeaseLost or ErrStaleToken) and writes nothing. The
// rounds alternate between synchronous_commit on and off for the role.
func TestSemaphoreLimitAndTokensSurviveImmediateShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cl, targets := newCrashCluster(t, "slotcrash")
	const (
		limit     = 3
		acquirers = 20
		ttl       = 5 * time.Second
	)
	for round := range crashRounds(t, 2) {
		tg := targets[round%len(targets)]
		sem := fmt.Sprintf("sem-%d", round)
		cl.Exec(tg.Database, "CHECKPOINT")
		var clients []*quota.Client
		var closers []func()
		for range 2 {
			c, closePool := crashLoadPool(t, tg.URL, 8, nil)
			requireSynchronousCommit(t, c, tg)
			clients = append(clients, c)
			closers = append(closers, closePool)
		}

		var mu sync.Mutex
		var holds []*slotHold
		held := make([]*slotHold, acquirers) // each acquirer's slot, nil when none
		written := make([]bool, acquirers)   // it wrote under its slot
		pending := make([]string, acquirers) // the attempt of an acquire of unknown outcome
		var sampled, sampledMax int
		load := newCrashLoad(t)
		load.Start(acquirers+1, func(w int) {
			if w == acquirers {
				// The sampler: what a reader of the semaphore sees.
				st, err := leaseOf(t, clients[0]).Semaphore(ctx, sem)
				if err == nil {
					var rows int
					err = clients[1].Pool().QueryRow(ctx, `SELECT count(*) FROM pgquota.lease
						WHERE name LIKE 'slot:' || $1 || ':%' AND expires_at > pgquota.clock()`, sem).Scan(&rows)
					if err == nil {
						mu.Lock()
						sampled++
						sampledMax = max(sampledMax, st.Held, len(st.Holders()), rows)
						mu.Unlock()
						for _, s := range st.Slots {
							if s.Index >= limit {
								t.Errorf("semaphore %s has a slot %d (limit %d)", sem, s.Index, limit)
							}
						}
					}
				}
				time.Sleep(5 * time.Millisecond)
				return
			}
			c := clients[w%2]
			h := held[w]
			switch {
			case h != nil && !written[w]:
				_, err := fenceOf(t, c).WriteRow(ctx, fence.WriteRowRequest{
					Resource: h.slot.Name, Key: "k", Value: fmt.Sprintf("w%d", w), Token: h.slot.Token, Lease: h.slot.Name,
				})
				if err != nil && isPreSend(err) {
					load.Failed("fenced write under "+h.slot.Name, err)
					time.Sleep(2 * time.Millisecond)
					return // nothing sent: write again
				}
				if err != nil {
					// The slot may have expired during the crash.
					load.Failed("fenced write under "+h.slot.Name, err, lease.ErrLost, fence.ErrStaleToken)
				}
				written[w] = true
				time.Sleep(10 * time.Millisecond)
			case h != nil:
				sent := time.Now()
				_, err := leaseOf(t, c).ReleaseSlot(ctx, h.slot)
				if err == nil || !isPreSend(err) {
					// It may have reached the server: the holder stops
					// counting on the slot from here on.
					mu.Lock()
					if h.releaseSent.IsZero() {
						h.releaseSent = sent
					}
					mu.Unlock()
				}
				if err == nil || errors.Is(err, lease.ErrLost) {
					held[w] = nil
					return
				}
				load.Failed("release of "+h.slot.Name, err) // repeated next time
				time.Sleep(2 * time.Millisecond)
			default:
				attempt := pending[w]
				if attempt == "" {
					attempt = lease.NewAttempt()
				}
				s, err := leaseOf(t, c).AcquireSlot(ctx, lease.SlotRequest{Semaphore: sem, Limit: limit, Holder: fmt.Sprintf("w%d", w), TTL: ttl, Attempt: attempt})
				pending[w] = ""
				switch {
				case err == nil:
					if s.Holders > limit || s.Index >= limit {
						t.Errorf("acquire of %s reported slot %d with %d holders (limit %d)", sem, s.Index, s.Holders, limit)
					}
					h := &slotHold{slot: s}
					mu.Lock()
					holds = append(holds, h)
					mu.Unlock()
					held[w], written[w] = h, false
				case errors.Is(err, lease.ErrSemaphoreFull):
					time.Sleep(3 * time.Millisecond)
				default:
					if load.Failed("acquire of a slot of "+sem, err) {
						pending[w] = attempt // learn its outcome with the same attempt
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
		time.Sleep(1200 * time.Millisecond)
		load.Crash(cl)

		// The state the server recovered, before any new call.
		check, closeCheck := crashClient(t, cl.URL(tg.Database))
		var restartedAt time.Time
		require.NoError(t, check.Pool().QueryRow(ctx, `SELECT pgquota.clock()`).Scan(&restartedAt))
		rows, err := check.Pool().Query(ctx, `SELECT name, token, expires_at FROM pgquota.lease WHERE name LIKE 'slot:' || $1 || ':%'`, sem)
		require.NoError(t, err)
		type leaseRow struct {
			token   int64
			expires time.Time
		}
		stored := map[string]leaseRow{}
		var maxBefore int64
		heldNow := 0
		for rows.Next() {
			var name string
			var r leaseRow
			require.NoError(t, rows.Scan(&name, &r.token, &r.expires))
			stored[name] = r
			maxBefore = max(maxBefore, r.token)
			if r.expires.After(restartedAt) {
				heldNow++
			}
		}
		require.NoError(t, rows.Err())
		require.LessOrEqual(t, heldNow, limit, "slots held after the restart")
		mu.Lock()
		before := len(holds)
		survived := 0
		for _, h := range holds {
			maxBefore = max(maxBefore, h.slot.Token)
			if h.releaseSent.IsZero() && h.slot.ExpiresAt.After(restartedAt) {
				// Held at the crash, and still by its TTL: the row says so.
				r := stored[h.slot.Name]
				require.Equal(t, h.slot.Token, r.token, "slot %s acquired with token %d before the crash", h.slot.Name, h.slot.Token)
				require.True(t, r.expires.Equal(h.slot.ExpiresAt), "slot %s expires at %s, reported %s", h.slot.Name, r.expires, h.slot.ExpiresAt)
				survived++
			}
		}
		mu.Unlock()
		require.Positive(t, before, "round %d: no slot acquired before the crash", round)
		closeCheck()

		load.Resume()
		time.Sleep(1500 * time.Millisecond)
		load.Stop()
		for _, c := range closers {
			c()
		}

		// Tokens: one acquisition each, and those after the restart above
		// every one before the crash.
		byToken := map[int64]*slotHold{}
		var after []*slotHold
		for _, h := range holds {
			if prev, ok := byToken[h.slot.Token]; ok {
				require.Equal(t, prev.slot.Attempt, h.slot.Attempt, "token %d issued twice: to slot %s and to slot %s", h.slot.Token, prev.slot.Name, h.slot.Name)
				continue // the same acquisition, learnt again with its attempt
			}
			byToken[h.slot.Token] = h
			if h.slot.AcquiredAt.After(restartedAt) {
				after = append(after, h)
				require.Greater(t, h.slot.Token, maxBefore, "slot %s acquired after the restart", h.slot.Name)
			} else {
				require.True(t, h.slot.AcquiredAt.Before(load.DownAt), "slot %s acquired at %s, while the server was down", h.slot.Name, h.slot.AcquiredAt)
			}
		}
		require.NotEmpty(t, after, "round %d: no slot acquired after the restart", round)

		// The holders the API reported, over time.
		type event struct {
			at    time.Time
			delta int
		}
		var events []event
		for _, h := range byToken {
			events = append(events, event{h.slot.AcquiredAt, 1}, event{h.end(), -1})
		}
		sort.Slice(events, func(i, j int) bool {
			if events[i].at.Equal(events[j].at) {
				return events[i].delta < events[j].delta // a release before an acquire at the same instant
			}
			return events[i].at.Before(events[j].at)
		})
		holding, deepest := 0, 0
		for _, e := range events {
			holding += e.delta
			deepest = max(deepest, holding)
		}
		require.LessOrEqual(t, deepest, limit, "holders the API reported at once")
		require.LessOrEqual(t, sampledMax, limit, "holders a reader saw at once")
		require.Positive(t, sampled)

		// A pre-crash token of a slot acquired again after the restart.
		check, closeCheck = crashClient(t, cl.URL(tg.Database))
		stale := 0
		for i := range limit {
			name := lease.SlotName(sem, i)
			var old, newer int64
			for _, h := range byToken {
				if h.slot.Name != name {
					continue
				}
				if h.slot.AcquiredAt.After(restartedAt) {
					newer = max(newer, h.slot.Token)
				} else {
					old = max(old, h.slot.Token)
				}
			}
			if old == 0 || newer == 0 {
				continue
			}
			stale++
			_, err := fenceOf(t, check).WriteRow(ctx, fence.WriteRowRequest{Resource: name, Key: "stale", Value: "x", Token: old})
			require.ErrorIs(t, err, fence.ErrStaleToken, "write to %s with pre-crash token %d after token %d", name, old, newer)
			_, err = fenceOf(t, check).WriteRow(ctx, fence.WriteRowRequest{Resource: name, Key: "stale", Value: "x", Token: old, Lease: name})
			require.True(t, errors.Is(err, lease.ErrLost) || errors.Is(err, fence.ErrStaleToken),
				"write to %s with pre-crash token %d, naming the lease, after token %d: %v", name, old, newer, err)
			_, err = fenceOf(t, check).Row(ctx, name, "stale")
			require.ErrorIs(t, err, fence.ErrRowNotFound, "the refused writes wrote nothing")
		}
		require.Positive(t, stale, "round %d: no slot was acquired both before the crash and after the restart", round)
		closeCheck()

		unknown, preSend := load.ErrorCounts()
		require.Positive(t, unknown+preSend, "round %d: no call noticed the crash", round)
		t.Logf("round %d (%s): %d acquisitions (%d before the crash, %d held through it, %d after the restart, tokens above %d), "+
			"at most %d holders reported at once, %d seen by %d samples; %d stale writes refused; crash and restart took %s; "+
			"%d errors of unknown outcome, %d clear errors before sending",
			round, tg.What, len(byToken), before, survived, len(after), maxBefore, deepest, sampledMax, sampled, stale,
			load.CrashDur.Round(time.Millisecond), unknown, preSend)
	}
}
