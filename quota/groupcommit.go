package quota

import (
	"context"
	"sync"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// Group commit across counters (Config.Grouping GroupAcrossCounters, the
// default).
//
// Coalescing (coalesce.go) shares a statement between the calls of ONE
// counter. Calls spread over many counters still take a statement and a
// commit each, and on a small server the commits are what it spends its
// time on: every commit waits for its WAL flush. Group commit shares the
// statement, and so the commit and its flush, between concurrent calls of
// one Client whatever their counters: while a statement is in flight, the
// calls that arrive wait in a queue, and the next statement decides all of
// them at once (DeWitt et al., "Implementation techniques for main memory
// database systems", SIGMOD 1984; PostgreSQL's commit_delay groups WAL
// flushes the same way, but only across sessions that commit at once).
//
// There is no timer. A call that finds no statement of its lane in flight
// runs at once, alone, in its own goroutine and with its own context, on
// Grant's single-statement path: it costs exactly what it costs without
// group commit. Only calls that arrive while groupInFlight statements are
// in flight wait, and they wait for the first of those statements to
// return, not for a clock.
//
// The statement that decides a group is GrantBatch's (pgquota.
// usage_grant_batch, migrations/00009_grant_batch.sql): set-based over
// arrays, it locks the counters in key order (so two groups, from this
// Client or another, never wait for each other in a cycle on existing
// counters), decides the calls of one counter one after another in arrival
// order, and reports per counter the value it wrote from, from which each
// call's outcome (Used included) is replayed. So each call gets exactly
// the outcome it would have got alone, had the calls run one after another
// in arrival order. A call's own error (no such quota, no limit) is its
// outcome and does not fail the others.
//
// Calls on quotas of kind rate, fixed or rolling join groups too: GrantBatch
// decides them with pgquota.grant_limits_batch (migrations/00016), each call
// as pgquota.grant_limits would alone, in arrival order, after locking the
// group's state rows in key order. A group holding calendar calls as well
// takes both statements in one transaction, so it still commits once. A
// grant against several quotas (GrantRequest.Quotas) runs alone (groupable).
//
// Calls with an idempotency key have a lane of their own (as in the
// coalescer): their group runs in one transaction that records the keys
// first, in key order, and may wait there for a key another transaction
// holds; unkeyed calls must not wait behind it. Within the keyed group a key
// given twice replays its first copy (batch_keyed.go).
//
// A call whose context ends while it waits is taken out of the queue and
// returns the context's error (nothing was sent, nothing granted). A call
// whose context ends after its group was sent returns ErrGrantAbandoned,
// which also wraps ErrOutcomeUnknown: the database decides it anyway, and
// the outcome goes to Config.OnAbandonedGrant. A lone call that runs on its
// own context behaves exactly as Grant without group commit.

// groupInFlight is how many statements of one lane a Client keeps in
// flight at once. Two let the server run one group's statement while it
// flushes the other's commit, where one would leave it idle between
// flushes; more only split the groups (see the group commit figures in
// docs/limits.md).
const groupInFlight = 8

// groupLane is one queue of grouped calls: the unkeyed ones, or the keyed.
type groupLane struct {
	waiting  []*waiter
	inFlight int // statements of this lane in flight, at most grouper.inFlight
	// busy counts, per counter, the calls of this lane in flight on it. A
	// waiting call of a busy counter stays queued until that statement
	// returns: the calls of one counter go one statement after another, as
	// in the coalescer, instead of several statements of this client
	// queueing in the counter's row lock. The map holds the counters in
	// flight only.
	busy map[groupCounter]int
}

// groupCounter is a counter of a group: quota and member (the window is the
// one the statement's clock falls in).
type groupCounter struct{ quota, member string }

func (ln *groupLane) hold(k groupCounter) {
	if ln.busy == nil {
		ln.busy = make(map[groupCounter]int)
	}
	ln.busy[k]++
}

func (ln *groupLane) unhold(k groupCounter) {
	if ln.busy[k]--; ln.busy[k] <= 0 {
		delete(ln.busy, k)
	}
	if len(ln.busy) == 0 {
		ln.busy = nil // a map never shrinks: drop it once idle
	}
}

// grouper queues Grant calls of any counter with group commit (the default
// Config.Grouping). It keeps no state per counter: its memory is that of the calls in
// flight.
type grouper struct {
	c        *Client
	inFlight int
	mu       sync.Mutex
	lanes    [2]groupLane // [0] unkeyed, [1] keyed
}

func newGrouper(c *Client) *grouper {
	return &grouper{c: c, inFlight: groupInFlight}
}

// groupable reports whether req may join a group: a grant of one quota,
// of any kind. A grant against several quotas (GrantRequest.Quotas) runs
// alone, on Grant's own statement: the group's per-counter bookkeeping
// (groupLane.busy) holds one counter per call.
func groupable(req GrantRequest) bool { return len(req.Quotas) == 0 }

// grant decides req (already validated): at once when its lane has room for
// another statement and nobody waits, else in the next group.
func (g *grouper) grant(ctx context.Context, req GrantRequest) (GrantResult, error) {
	if err := ctx.Err(); err != nil {
		return GrantResult{}, err
	}
	ln := &g.lanes[0]
	if req.Idempotency.Key != "" {
		ln = &g.lanes[1]
	}
	k := groupCounter{req.Quota, req.Member}
	g.mu.Lock()
	if !g.aloneOK(ln, k) {
		// It will be queued: a call for a rate, fixed or rolling quota is
		// decided by pgquota.grant_limits_batch, which checks it as
		// grant_limits does (a key refused), so its kind is read first
		// (cached after the first call of the quota).
		g.mu.Unlock()
		if g.c.shapedRoute(ctx, g.c.db.Reads(), req) {
			if _, err := checkGrantRequest(req, true); err != nil {
				return GrantResult{}, err
			}
		}
		g.mu.Lock()
	}
	if g.aloneOK(ln, k) {
		// Alone: Grant's own path, on the caller's context.
		ln.inFlight++
		ln.hold(k)
		g.mu.Unlock()
		if hook := g.c.testHookGroupSend; hook != nil {
			hook([]GrantRequest{req})
		}
		res, err := g.c.grant(ctx, g.c.db, req)
		g.mu.Lock()
		ln.unhold(k)
		if len(ln.waiting) > 0 {
			// Calls arrived meanwhile: this statement's place goes to a
			// goroutine that sends them.
			go g.run(ln)
		} else {
			ln.inFlight--
		}
		g.mu.Unlock()
		return res, err
	}
	w := &waiter{ctx: ctx, req: req, done: make(chan struct{})}
	ln.waiting = append(ln.waiting, w)
	if ln.inFlight < g.inFlight {
		ln.inFlight++
		go g.run(ln)
	}
	g.mu.Unlock()

	return w.await(ctx, &g.mu, &ln.waiting)
}

// aloneOK reports whether a call of counter k may run alone now: its lane
// has room for another statement, nobody waits, and k is in no statement
// in flight. Called with g.mu held.
func (g *grouper) aloneOK(ln *groupLane, k groupCounter) bool {
	return ln.inFlight < g.inFlight && len(ln.waiting) == 0 && ln.busy[k] == 0
}

// abandonedError is the error of a grouped or coalesced call whose caller
// gave up after the call was sent.
func abandonedError(ctx context.Context) error {
	return core.Errorf("%w (%w): %w", ErrGrantAbandoned, ErrOutcomeUnknown, ctx.Err())
}

// run sends the groups of lane ln, one at a time, each of the calls waiting
// when the previous one returned, until none waits; it holds one of the
// lane's places in flight.
func (g *grouper) run(ln *groupLane) {
	for {
		g.mu.Lock()
		var batch, kept []*waiter
		for _, w := range ln.waiting {
			switch {
			case len(batch) == maxCoalesceBatch:
				kept = append(kept, w)
			case w.ctx.Err() != nil:
				w.state = waitDropped
			case ln.busy[groupCounter{w.req.Quota, w.req.Member}] > 0:
				// Its counter is in a statement in flight: the next
				// group after that one takes it.
				kept = append(kept, w)
			default:
				w.state = waitSent
				batch = append(batch, w)
			}
		}
		ln.waiting = kept
		if len(batch) == 0 {
			// Nothing to send now; the calls still waiting, if any, are on
			// counters in flight, whose runners take them next.
			ln.inFlight--
			g.mu.Unlock()
			return
		}
		for _, w := range batch {
			ln.hold(groupCounter{w.req.Quota, w.req.Member})
		}
		g.mu.Unlock()
		g.send(ln, batch)
	}
}

// send decides one group and delivers the outcomes.
//
// A group of several calls waits at most groupLockWait for a lock another
// transaction holds (an application transaction that granted on one of
// its counters with GrantTx and has not committed, a SELECT ... FOR UPDATE
// of plain SQL): past it the statement fails with 55P03 having written
// nothing, and the group splits into its counters (splitByCounter), so
// that one held row never stalls the calls of other counters for longer
// than groupLockWait. A group of one waits as Grant does.
func (g *grouper) send(ln *groupLane, batch []*waiter) {
	reqs := requestsOf(batch)
	if hook := g.c.testHookGroupSend; hook != nil {
		hook(reqs)
	}
	// The statement serves every caller of the group: none of their
	// contexts may cancel it (context.WithoutCancel keeps the first one's
	// values, for tracing).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), coalesceStatementTimeout)
	g.c.m.StatementSizeOf(batch[0].ctx, core.PathGroup, len(batch))
	outcomes := make([]BatchOutcome, len(batch))
	var err error
	if len(batch) == 1 {
		// A group of one takes Grant's single statement (one statement
		// also with a key, where a keyed group takes four).
		outcomes[0].GrantResult, outcomes[0].Err = g.c.grant(ctx, g.c.db, reqs[0])
	} else {
		outcomes, err = g.c.grantBatchOwn(ctx, reqs, groupLockWait)
		if err != nil && core.IsLockWaitBounded(err) {
			cancel()
			g.splitByCounter(ln, batch)
			return
		}
		if err != nil {
			err = core.Errorf("pgquota: grant: group commit: %w", err)
		}
	}
	cancel()
	g.deliver(ln, batch, outcomes, err)
}

// groupLockWait bounds how long a group of several calls waits for a lock
// held by a transaction outside it (see send). Waits for another group's
// or another Client's statement on the same counters last a statement and
// a commit, well under it; a group that passes it only splits, and its
// calls are still decided exactly.
const groupLockWait = 100 * time.Millisecond

// splitByCounter decides the calls of a group whose statement waited past
// groupLockWait, nothing written: each counter's calls (in arrival order)
// take a statement of their own, up to groupInFlight at once, each waiting
// at most groupLockWait again. A counter that still waits is the one held:
// its calls go on in a goroutine of their own that waits as Grant does,
// leaving the others free. Every counter stays held in ln.busy until its
// calls are delivered, so later calls of a held counter queue behind them
// instead of joining new groups.
func (g *grouper) splitByCounter(ln *groupLane, batch []*waiter) {
	var order []groupCounter
	by := make(map[groupCounter][]*waiter)
	for _, w := range batch {
		k := groupCounter{w.req.Quota, w.req.Member}
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], w)
	}
	sem := make(chan struct{}, groupInFlight)
	for _, k := range order {
		ws := by[k]
		sem <- struct{}{}
		go func() {
			outcomes, err := g.decideAlone(ws, groupLockWait)
			<-sem
			if err != nil && core.IsLockWaitBounded(err) {
				outcomes, err = g.decideAlone(ws, 0)
			}
			g.deliverSplit(ln, ws, outcomes, err)
		}()
	}
	// Once every counter had its bounded try, the runner goes on with the
	// queue; a held counter's goroutine waits and delivers on its own.
	for range cap(sem) {
		sem <- struct{}{}
	}
}

// decideAlone runs the calls ws of one counter as one statement (a batch
// when there are several), waiting at most lockWait for locks when it is
// set, else as Grant does.
func (g *grouper) decideAlone(ws []*waiter, lockWait time.Duration) ([]BatchOutcome, error) {
	reqs := requestsOf(ws)
	if hook := g.c.testHookGroupSend; hook != nil {
		hook(reqs)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ws[0].ctx), coalesceStatementTimeout)
	defer cancel()
	outcomes, err := g.c.grantBatchOwn(ctx, reqs, lockWait)
	if err != nil && !core.IsLockWaitBounded(err) {
		err = core.Errorf("pgquota: grant: group commit: %w", err)
	}
	return outcomes, err
}

// deliverSplit delivers the calls of one counter of a split group, and
// starts a runner when calls wait and the lane has room: the group's
// runner may have ended meanwhile, with those calls queued behind this
// counter.
func (g *grouper) deliverSplit(ln *groupLane, ws []*waiter, outcomes []BatchOutcome, err error) {
	g.deliver(ln, ws, outcomes, err)
	g.mu.Lock()
	if len(ln.waiting) > 0 && ln.inFlight < g.inFlight {
		ln.inFlight++
		go g.run(ln)
	}
	g.mu.Unlock()
}

func requestsOf(ws []*waiter) []GrantRequest {
	reqs := make([]GrantRequest, len(ws))
	for i, w := range ws {
		reqs[i] = w.req
	}
	return reqs
}

// deliver sets the outcomes of batch (or err for all of them), releases
// their counters and wakes their callers; the outcomes of callers that gave
// up go to Config.OnAbandonedGrant.
func (g *grouper) deliver(ln *groupLane, batch []*waiter, outcomes []BatchOutcome, err error) {
	var abandoned []*waiter
	g.mu.Lock()
	for i, w := range batch {
		ln.unhold(groupCounter{w.req.Quota, w.req.Member})
		if err != nil {
			w.err = err
		} else {
			w.res, w.err = outcomes[i].GrantResult, outcomes[i].Err
		}
		if w.state == waitAbandoned {
			abandoned = append(abandoned, w)
		}
		w.state = waitDone
	}
	g.mu.Unlock()
	for _, w := range batch {
		close(w.done)
	}
	if hook := g.c.cfg.OnAbandonedGrant; hook != nil {
		for _, w := range abandoned {
			hook(w.req, w.res, w.err)
		}
	}
}
