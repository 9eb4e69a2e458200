package quota

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// Coalesced grants (Config.Grouping GroupByCounter).
//
// One hot counter takes one conditional UPDATE per commit: the row stays
// locked until the commit's WAL flush, so callers of one counter queue one
// flush after another. Coalescing is group commit applied to that queue
// (DeWitt et al., "Implementation techniques for main memory database
// systems", SIGMOD 1984; PostgreSQL's own commit_delay does it for WAL
// flushes): while one statement for a counter is in flight, the calls that
// arrive for the same counter wait in a queue, and the next statement
// decides all of them at once, with one row lock and one flush.
//
// The statement is GrantBatch's (queries/usage_batch.sql): it locks the
// counter at its newest version and adds pgquota.greedy_take of that value,
// which decides the queued calls one after another in arrival order; the
// per-call outcomes are replayed in Go from the counter's value before and
// after. So a coalesced call gets exactly the outcome, Used included, that
// it would have got had the calls run one after another in arrival order.
//
// Calls on a quota of kind rate, fixed or rolling are coalesced the same
// way, through GrantBatch's statement for those kinds,
// pgquota.grant_limits_batch (migrations/00016_shaped_batch.sql): it calls
// pgquota.grant_limits for each queued call in arrival order, with the
// counter's row locked once for all of them, so each call is decided at its
// own instant of the database clock, exactly as alone (DecidedAt,
// RetryAfter, ResetAfter and Limits included), with one commit for the
// batch. A grant against several quotas (GrantRequest.Quotas) is not
// coalesced: it has no single counter to queue on, and runs alone.

// Calls with an idempotency key are coalesced too: their batch runs in one
// transaction that records each key in the grant ledger first, grants the
// calls whose key it recorded together with the unkeyed ones, and stores
// each recorded call's outcome under its own grant id (batch_keyed.go,
// queries/ledger_batch.sql). A keyed call whose key was taken before, or
// by an earlier call of the same batch, replays that outcome. A keyed call
// abandoned after it was sent has its outcome in the ledger: repeating the
// call with its key returns it.

// maxCoalesceBatch bounds the calls one coalesced statement decides; the
// rest wait for the next statement.
const maxCoalesceBatch = 1024

// coalesceStatementTimeout bounds one coalesced statement. It runs on
// behalf of every call in its batch, so no single caller's context may
// cancel it; each caller's own context still bounds its wait.
const coalesceStatementTimeout = time.Minute

// coalesceKey identifies the calls that may share one statement: the same
// counter (quota and member; the window is the one the statement's clock
// falls in) and the same limit, given or not. Keyed and unkeyed calls queue
// apart: a keyed batch first records its keys and may wait for a key that
// another transaction holds (a copy of the same request in flight), and
// unkeyed calls of the counter must not wait behind it. The two queues'
// statements serialize on the counter's row lock, each deciding against its
// newest version, so the limit stays exact.
type coalesceKey struct {
	quota, member string
	hasLimit      bool
	limit         int64
	keyed         bool
}

// waiter states, changed under coalescer.mu only.
const (
	waitQueued    = iota // in its queue, not sent yet
	waitDropped          // taken out unsent, its context had ended
	waitSent             // in a statement in flight
	waitAbandoned        // sent, and its caller gave up
	waitDone             // outcome delivered
)

// waiter is one coalesced call.
type waiter struct {
	ctx   context.Context
	req   GrantRequest
	state int
	res   GrantResult
	err   error
	done  chan struct{} // closed when the outcome is set
}

// await waits for w's outcome or for ctx to end. When ctx ends first, it
// takes mu (the lock of the queue w was added to) and, by w's state, drops
// w from waiting (not sent yet: nothing granted, the context's error),
// marks it abandoned (sent: ErrGrantAbandoned, outcome unknown), or returns
// the outcome that arrived together with the cancellation. The coalescer
// and group commit share it.
func (w *waiter) await(ctx context.Context, mu *sync.Mutex, waiting *[]*waiter) (GrantResult, error) {
	select {
	case <-w.done:
		return w.res, w.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	switch w.state {
	case waitQueued:
		*waiting = slices.DeleteFunc(*waiting, func(x *waiter) bool { return x == w })
		w.state = waitDropped
		return GrantResult{}, ctx.Err()
	case waitDropped:
		return GrantResult{}, ctx.Err()
	case waitSent:
		w.state = waitAbandoned
		return GrantResult{}, abandonedError(ctx)
	default: // waitDone: the outcome arrived together with the cancellation
		return w.res, w.err
	}
}

// queue holds the calls of one key that wait for a statement. running is
// true while a goroutine sends its statements; the queue leaves the
// coalescer's map when that goroutine finds it empty.
type queue struct {
	waiting []*waiter
	running bool
}

// coalescer queues coalesced calls per key.
type coalescer struct {
	c      *Client
	mu     sync.Mutex
	queues map[coalesceKey]*queue
}

func newCoalescer(c *Client) *coalescer {
	return &coalescer{c: c, queues: make(map[coalesceKey]*queue)}
}

// grant queues req (already validated) and waits for its outcome or for
// ctx to end.
func (co *coalescer) grant(ctx context.Context, req GrantRequest) (GrantResult, error) {
	k := coalesceKey{quota: req.Quota, member: req.Member, keyed: req.Idempotency.Key != ""}
	if req.Limit != nil {
		k.hasLimit, k.limit = true, *req.Limit
	}
	if err := ctx.Err(); err != nil {
		return GrantResult{}, err
	}
	w := &waiter{ctx: ctx, req: req, done: make(chan struct{})}
	co.mu.Lock()
	q := co.queues[k]
	if q == nil {
		q = &queue{}
		co.queues[k] = q
	}
	q.waiting = append(q.waiting, w)
	if !q.running {
		q.running = true
		go co.run(k, q)
	}
	co.mu.Unlock()

	return w.await(ctx, &co.mu, &q.waiting)
}

// run sends the statements of queue q, one at a time, each for every call
// that is waiting when the previous one returns, until the queue is empty.
func (co *coalescer) run(k coalesceKey, q *queue) {
	for {
		co.mu.Lock()
		var batch []*waiter
		for len(q.waiting) > 0 && len(batch) < maxCoalesceBatch {
			w := q.waiting[0]
			q.waiting = q.waiting[1:]
			if w.ctx.Err() != nil {
				w.state = waitDropped
				continue
			}
			w.state = waitSent
			batch = append(batch, w)
		}
		if len(batch) == 0 {
			q.running = false
			delete(co.queues, k)
			co.mu.Unlock()
			return
		}
		co.mu.Unlock()
		co.send(batch)
	}
}

// send runs one coalesced statement for batch and delivers the outcomes.
func (co *coalescer) send(batch []*waiter) {
	reqs := make([]GrantRequest, len(batch))
	for i, w := range batch {
		reqs[i] = w.req
	}
	// The statement serves every caller of the batch: none of their
	// contexts may cancel it (context.WithoutCancel keeps the first one's
	// values, for tracing).
	if hook := co.c.testHookCoalesceSend; hook != nil {
		hook(len(batch))
	}
	co.c.m.StatementSizeOf(batch[0].ctx, core.PathCoalesce, len(batch))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), coalesceStatementTimeout)
	outcomes, err := co.c.grantBatchOwn(ctx, reqs, 0)
	cancel()
	if err != nil {
		// The callers called Grant: their error says so, once prefixed,
		// with the batch's classification (ErrOutcomeUnknown or not) kept.
		err = core.Errorf("pgquota: grant: coalesced statement: %w", err)
	}

	var abandoned []*waiter
	co.mu.Lock()
	for i, w := range batch {
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
	co.mu.Unlock()
	for _, w := range batch {
		close(w.done)
	}
	if hook := co.c.cfg.OnAbandonedGrant; hook != nil {
		for _, w := range abandoned {
			hook(w.req, w.res, w.err)
		}
	}
}

// queued returns the number of calls waiting (not sent) for quota and
// member, any limit.
func (co *coalescer) queued(quota, member string) int {
	co.mu.Lock()
	defer co.mu.Unlock()
	n := 0
	for k, q := range co.queues {
		if k.quota == quota && k.member == member {
			n += len(q.waiting)
		}
	}
	return n
}
