package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// A linearizability check of the fenced lock. Each run
// records a history on one resource of two keys: holders acquire the lease
// of the resource's name, renew it, write fenced values and read them back;
// a holder is paused in the middle of a write (a real child process stopped
// with SIGSTOP and continued with SIGCONT, or a goroutine asleep) until its
// lease has expired by the database clock and a successor has acquired it,
// or until the lease has merely lapsed. Concurrent acquirers race for the
// lease meanwhile, one of them against a successor whose acquiring
// transaction is still open. The history is checked with porcupine against
// a model of a fenced lease: a register of two keys whose store admits a
// write only with a token at least as high as any acquired or written
// before it, and a lease that at most one acquisition holds at any instant
// of the database clock.
//
// The harness drives the operations through historyStore, so the same
// workload runs on the real client (here) and on deliberately faulty fence
// and lease paths (fence_history_faults_test.go), which it must report
// non-linearizable in at least 19 of 20 runs.

const (
	historyKeys = 2
	// historyRuns is the number of histories recorded per implementation.
	historyRuns = 20
	// historyTTL is the TTL of the leases a run acquires; every pause
	// outlasts it (a paused holder is continued only once its lease has
	// expired by the database clock), so no outcome depends on how fast
	// the machine is.
	historyTTL = 150 * time.Millisecond
	// historyRaceTTL is the TTL of the successor whose acquiring
	// transaction stays open while another acquirer races it: long enough
	// that the racer's steal, if the path allows one, falls inside it.
	historyRaceTTL = 2 * time.Second
	// historyRunTimeout bounds one run.
	historyRunTimeout = 45 * time.Second
)

// historyRunSlots bounds the runs in flight in the package, over every test
// that records histories: each takes about three connections.
var historyRunSlots = make(chan struct{}, 10)

// ---- The model ----

type historyOpKind int

const (
	opAcquire historyOpKind = iota
	opRenew
	opRelease
	opWrite
	opRead
)

type historyInput struct {
	kind   historyOpKind
	key    int
	token  int64  // renew, release, write: the caller's token
	value  string // write
	leased bool   // write: checked against the lease as well as the fence
}

type historyOutcome int

const (
	outcomeOK    historyOutcome = iota
	outcomeStale                // ErrStaleToken
	outcomeLost                 // ErrLeaseLost
)

type historyOutput struct {
	outcome historyOutcome
	token   int64  // acquire: the token; read: the value's token
	value   string // read
	// at is a reading of the database clock, in microseconds since the
	// Unix epoch. For an acquire it is read after the acquisition
	// committed, so the lease was taken no later than at (acquired_at,
	// read when the statement started, can be earlier than the instant
	// the lease changed hands when the statement waited for a lock). For
	// a renew or release it is the statement's reading, no later than the
	// instant the row was checked.
	at int64
	// expires is the lease's expiry after an acquire, renew or release,
	// in the same unit.
	expires int64
}

// fencedLease is the model's state. It is comparable, so porcupine's
// default equality works, and Step never mutates it.
type fencedLease struct {
	values  [historyKeys]string
	tokens  [historyKeys]int64
	highest int64 // highest token acquired or written
	holder  int64 // token of the latest acquisition; 0 before the first
	expires int64 // that acquisition's expiry, database clock (µs)
}

var fencedLeaseModel = porcupine.Model{
	Init: func() any { return fencedLease{} },
	Step: func(state, input, output any) (bool, any) {
		s := state.(fencedLease)
		in := input.(historyInput)
		out := output.(historyOutput)
		switch in.kind {
		case opAcquire:
			// Tokens strictly increase, and no acquisition takes the lease
			// while, by the database clock, the previous holder's lease has
			// not ended (mutual exclusion): one that was complete before
			// that end stole it. The token counts as seen by the resource
			// of the lease's name.
			if out.token <= s.highest || (s.holder != 0 && out.at < s.expires) {
				return false, s
			}
			s.highest, s.holder, s.expires = out.token, out.token, out.expires
			return true, s
		case opRenew:
			if out.outcome != outcomeOK {
				// A refused renewal changes nothing. (Whether the lease was
				// still held by the clock is not known to the model.)
				return true, s
			}
			// Only the current holder renews, and only before its expiry.
			if in.token != s.holder || out.at >= s.expires {
				return false, s
			}
			s.expires = out.expires
			return true, s
		case opRelease:
			// A release succeeds exactly when the lease row still carries
			// the caller's token (an expired lease may be released).
			if out.outcome != outcomeOK {
				return in.token != s.holder, s
			}
			if in.token != s.holder {
				return false, s
			}
			s.expires = out.expires
			return true, s
		case opWrite:
			switch out.outcome {
			case outcomeOK:
				if in.token < s.highest || (in.leased && in.token != s.holder) {
					return false, s
				}
				s.values[in.key], s.tokens[in.key] = in.value, in.token
				s.highest = in.token
				return true, s
			case outcomeStale:
				return in.token < s.highest, s
			default: // outcomeLost: the writer's own lease lapsed
				return in.leased && in.token >= s.highest, s
			}
		default:
			return out.value == s.values[in.key] && out.token == s.tokens[in.key], s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(historyInput), output.(historyOutput)
		outcome := []string{"ok", "stale", "lost"}[out.outcome]
		switch in.kind {
		case opAcquire:
			return fmt.Sprintf("acquire -> %d, held by %d until %d", out.token, out.at, out.expires)
		case opRenew:
			return fmt.Sprintf("renew(%d) -> %s at %d until %d", in.token, outcome, out.at, out.expires)
		case opRelease:
			return fmt.Sprintf("release(%d) -> %s at %d", in.token, outcome, out.at)
		case opWrite:
			return fmt.Sprintf("write(k%d, %q, token %d, leased %v) -> %s", in.key, in.value, in.token, in.leased, outcome)
		default:
			return fmt.Sprintf("read(k%d) -> %q@%d", in.key, out.value, out.token)
		}
	},
}

// ---- The operations the harness drives ----

// leaseGrant is a lease as an acquire, renew or release reported it.
type leaseGrant struct {
	token int64
	// at is the acquire's acquired_at, or the renew's or release's
	// database clock reading.
	at      time.Time
	expires time.Time
}

// historyWrite is one fenced write.
type historyWrite struct {
	resource, key, value string
	token                int64
	// leased asks for the write to be checked against the lease of the
	// resource's name as well as against the resource's fence.
	leased bool
	// pause, when not nil, is called once where the write path is most
	// exposed to a pause: before its statement, or between a check and
	// the write that relies on it. It returns when the pause is over.
	pause func()
}

// historyStore is what the harness drives. Errors: lease.ErrHeld from
// acquire, lease.ErrLost from renew, release and a leased write,
// fence.ErrStaleToken from write; anything else fails the run.
type historyStore interface {
	// acquire takes the lease resource for ttl. With hold set, it acquires
	// in a transaction and calls hold, with the backend pid of that
	// transaction, after the acquiring statement and before the commit.
	acquire(ctx context.Context, resource, holder string, ttl time.Duration, hold func(ctx context.Context, pid uint32)) (leaseGrant, error)
	renew(ctx context.Context, resource string, token int64, ttl time.Duration) (leaseGrant, error)
	release(ctx context.Context, resource string, token int64) (leaseGrant, error)
	write(ctx context.Context, w historyWrite) error
	// read returns the key's value and token ("" and 0 when unwritten).
	read(ctx context.Context, resource, key string) (string, int64, error)
	// leaseChecked says whether a write asked for with leased = requested
	// is checked against the lease.
	leaseChecked(requested bool) bool
}

// clientStore is historyStore over the real quota.Client.
type clientStore struct {
	pool   *pgxpool.Pool
	client *quota.Client
}

func grantOf(l lease.Lease, at time.Time) leaseGrant {
	return leaseGrant{token: l.Token, at: at, expires: l.ExpiresAt}
}

func (s clientStore) acquire(ctx context.Context, resource, holder string, ttl time.Duration, hold func(context.Context, uint32)) (leaseGrant, error) {
	req := lease.AcquireRequest{Name: resource, Holder: holder, TTL: ttl}
	if hold == nil {
		l, err := s.leases().Acquire(ctx, req)
		return grantOf(l, l.AcquiredAt), err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return leaseGrant{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	l, err := s.leases().AcquireTx(ctx, tx, req)
	if err != nil {
		return leaseGrant{}, err
	}
	hold(ctx, tx.Conn().PgConn().PID())
	return grantOf(l, l.AcquiredAt), tx.Commit(ctx)
}

func (s clientStore) renew(ctx context.Context, resource string, token int64, ttl time.Duration) (leaseGrant, error) {
	l, err := s.leases().Renew(ctx, lease.Lease{Name: resource, Token: token}, ttl)
	return grantOf(l, l.DBNow), err
}

func (s clientStore) release(ctx context.Context, resource string, token int64) (leaseGrant, error) {
	l, err := s.leases().Release(ctx, lease.Lease{Name: resource, Token: token})
	return grantOf(l, l.DBNow), err
}

func (s clientStore) write(ctx context.Context, w historyWrite) error {
	if w.pause != nil {
		w.pause()
	}
	req := fence.WriteRowRequest{Resource: w.resource, Key: w.key, Value: w.value, Token: w.token}
	if w.leased {
		req.Lease = w.resource
	}
	_, err := s.fences().WriteRow(ctx, req)
	return err
}

func (s clientStore) read(ctx context.Context, resource, key string) (string, int64, error) {
	row, err := s.fences().Row(ctx, resource, key)
	if errors.Is(err, fence.ErrRowNotFound) {
		return "", 0, nil
	}
	return row.Value, row.Token, err
}

func (clientStore) leaseChecked(requested bool) bool { return requested }

// ---- Recording ----

type historyRecorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func (r *historyRecorder) now() int64 { return time.Since(r.start).Nanoseconds() }

func (r *historyRecorder) add(client int, in historyInput, call int64, out historyOutput) {
	ret := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

func (r *historyRecorder) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

// historyActor is one client of a run: a goroutine of the test, or a child
// process (proc set) that the harness stops and continues.
type historyActor struct {
	id     int
	holder string
	store  historyStore
	proc   *historyWorker
}

// historyStats counts what a run exercised.
type historyStats struct {
	staleRejected int // writes rejected with ErrStaleToken
	stops         int // pauses made by stopping a child process
	sleeps        int // pauses made by a goroutine sleeping
	takeovers     int // successors that acquired while a holder was paused
	lapses        int // pauses after which the lease had only lapsed
	racesBlocked  int // racers seen waiting on a successor's open transaction
	steals        int // racers that acquired over that open transaction
}

// historyRun records one history.
type historyRun struct {
	ctx      context.Context
	resource string
	rng      *rand.Rand
	rec      *historyRecorder
	pool     *pgxpool.Pool // for the harness's own queries (clock, lock waits)
	races    chan struct{} // bounds the transactions held open by races
	stats    historyStats
	// unexpected lists outcomes that differ from what the real client must
	// report (checked by TestFenceHistoryIsLinearizable only).
	unexpected []string
	mu         sync.Mutex
}

func (h *historyRun) expect(round int, what string, got, want historyOutcome) {
	if got != want {
		names := []string{"ok", "stale", "lost"}
		h.mu.Lock()
		h.unexpected = append(h.unexpected, fmt.Sprintf("round %d: %s: got %s, want %s", round, what, names[got], names[want]))
		h.mu.Unlock()
	}
}

func outcomeOf(err error) (historyOutcome, error) {
	switch {
	case err == nil:
		return outcomeOK, nil
	case errors.Is(err, fence.ErrStaleToken):
		return outcomeStale, nil
	case errors.Is(err, lease.ErrLost):
		return outcomeLost, nil
	}
	return 0, err
}

func (h *historyRun) jitter(minMs, maxMs int) {
	h.mu.Lock()
	d := time.Duration(minMs+h.rng.IntN(maxMs-minMs+1)) * time.Millisecond
	h.mu.Unlock()
	time.Sleep(d)
}

func (h *historyRun) intn(n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rng.IntN(n)
}

// tryAcquire makes one attempt; only a successful one is recorded (a
// refused attempt changes nothing). It returns ok = false for ErrLeaseHeld
// and for a serialization failure of the acquiring transaction.
func (h *historyRun) tryAcquire(a *historyActor, ttl time.Duration, hold func(context.Context, uint32)) (leaseGrant, bool, error) {
	call := h.rec.now()
	g, err := a.store.acquire(h.ctx, h.resource, a.holder, ttl, hold)
	switch {
	case err == nil:
		var after time.Time
		if err := h.pool.QueryRow(h.ctx, `SELECT pgquota.clock()`).Scan(&after); err != nil {
			return g, false, fmt.Errorf("read the database clock: %w", err)
		}
		h.rec.add(a.id, historyInput{kind: opAcquire}, call, historyOutput{token: g.token, at: after.UnixMicro(), expires: g.expires.UnixMicro()})
		return g, true, nil
	case errors.Is(err, lease.ErrHeld), quota.IsRetryable(err):
		return leaseGrant{}, false, nil
	}
	return leaseGrant{}, false, fmt.Errorf("%s acquire: %w", a.holder, err)
}

// acquireUntil polls until a acquires the lease.
func (h *historyRun) acquireUntil(a *historyActor, ttl time.Duration, hold func(context.Context, uint32)) (leaseGrant, error) {
	for {
		g, ok, err := h.tryAcquire(a, ttl, hold)
		if ok || err != nil {
			return g, err
		}
		if err := h.ctx.Err(); err != nil {
			return leaseGrant{}, fmt.Errorf("%s never acquired the lease: %w", a.holder, err)
		}
		h.jitter(2, 8)
	}
}

func (h *historyRun) renew(a *historyActor, token int64, ttl time.Duration) (leaseGrant, historyOutcome, error) {
	call := h.rec.now()
	g, err := a.store.renew(h.ctx, h.resource, token, ttl)
	out, err := outcomeOf(err)
	if err != nil {
		return g, out, fmt.Errorf("%s renew: %w", a.holder, err)
	}
	o := historyOutput{outcome: out}
	if out == outcomeOK {
		o.at, o.expires = g.at.UnixMicro(), g.expires.UnixMicro()
	}
	h.rec.add(a.id, historyInput{kind: opRenew, token: token}, call, o)
	return g, out, nil
}

func (h *historyRun) release(a *historyActor, token int64) (historyOutcome, error) {
	call := h.rec.now()
	g, err := a.store.release(h.ctx, h.resource, token)
	out, err := outcomeOf(err)
	if err != nil {
		return out, fmt.Errorf("%s release: %w", a.holder, err)
	}
	o := historyOutput{outcome: out}
	if out == outcomeOK {
		o.at, o.expires = g.at.UnixMicro(), g.expires.UnixMicro()
	}
	h.rec.add(a.id, historyInput{kind: opRelease, token: token}, call, o)
	return out, nil
}

func (h *historyRun) write(a *historyActor, key int, token int64, leased bool, value string, pause func()) (historyOutcome, error) {
	leased = a.store.leaseChecked(leased)
	call := h.rec.now()
	err := a.store.write(h.ctx, historyWrite{resource: h.resource, key: fmt.Sprint("k", key), value: value, token: token, leased: leased, pause: pause})
	out, err := outcomeOf(err)
	if err != nil {
		return out, fmt.Errorf("%s write: %w", a.holder, err)
	}
	if out == outcomeStale {
		h.mu.Lock()
		h.stats.staleRejected++
		h.mu.Unlock()
	}
	h.rec.add(a.id, historyInput{kind: opWrite, key: key, token: token, value: value, leased: leased}, call, historyOutput{outcome: out})
	return out, nil
}

func (h *historyRun) read(a *historyActor, key int) error {
	call := h.rec.now()
	v, tok, err := a.store.read(h.ctx, h.resource, fmt.Sprint("k", key))
	if err != nil {
		return fmt.Errorf("%s read: %w", a.holder, err)
	}
	h.rec.add(a.id, historyInput{kind: opRead, key: key}, call, historyOutput{value: v, token: tok})
	return nil
}

// pausedWrite is a write started with a pause in it.
type pausedWrite struct {
	paused chan struct{} // closed when the writer is paused
	resume chan struct{} // closed to end the pause
	done   chan error
	out    historyOutcome
	leased bool  // the write was checked against the lease
	err    error // of the pause itself (stopping or continuing a process)

	finishOnce sync.Once
	result     error
}

// finish ends the pause and waits for the write; it may be called again
// (a round that fails ends the pause on its way out).
func (pw *pausedWrite) finish() error {
	pw.finishOnce.Do(func() {
		close(pw.resume)
		pw.result = <-pw.done
	})
	return pw.result
}

// startPausedWrite starts a's write and returns once a is paused in it
// (or the write returned without reaching its pause point). A child
// process is paused by SIGSTOP and continued by SIGCONT; a goroutine
// sleeps at least half a TTL and until resumed.
func (h *historyRun) startPausedWrite(a *historyActor, key int, token int64, leased bool, value string) *pausedWrite {
	pw := &pausedWrite{paused: make(chan struct{}), resume: make(chan struct{}), done: make(chan error, 1), leased: a.store.leaseChecked(leased)}
	var once sync.Once
	pause := func() {
		if a.proc != nil {
			if err := a.proc.stop(); err != nil {
				pw.err = err
			} else {
				h.mu.Lock()
				h.stats.stops++
				h.mu.Unlock()
			}
			once.Do(func() { close(pw.paused) })
			<-pw.resume
			if err := a.proc.cont(); err != nil && pw.err == nil {
				pw.err = err
			}
			return
		}
		h.mu.Lock()
		h.stats.sleeps++
		h.mu.Unlock()
		once.Do(func() { close(pw.paused) })
		time.Sleep(historyTTL / 2)
		<-pw.resume
	}
	go func() {
		out, err := h.write(a, key, token, leased, value, pause)
		if err == nil {
			err = pw.err
		}
		pw.out = out
		once.Do(func() { close(pw.paused) })
		pw.done <- err
	}()
	<-pw.paused
	return pw
}

// waitClockPast waits until the database clock is past at.
func (h *historyRun) waitClockPast(at time.Time) error {
	for {
		var past bool
		if err := h.pool.QueryRow(h.ctx, `SELECT pgquota.clock() > $1`, at).Scan(&past); err != nil {
			return fmt.Errorf("read the database clock: %w", err)
		}
		if past {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitBlockedBy waits until a backend waits for a lock held by pid, or
// until done is closed or 5 s have passed; it reports whether one did.
func (h *historyRun) waitBlockedBy(ctx context.Context, pid uint32, done <-chan struct{}) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := h.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, int32(pid)).Scan(&n)
		if err == nil && n > 0 {
			return true
		}
		select {
		case <-done:
			return false
		case <-time.After(3 * time.Millisecond):
		}
	}
	return false
}

// Round shapes. In every round a holder A acquires, writes, reads, renews
// and starts a write in which it is paused. Then, in a takeover round, a
// successor B acquires (only possible once A's lease has expired), writes
// the key A is about to write, the other key, or nothing, and reads A's
// key; in a lapse round nobody acquires, and the harness waits until A's
// lease has expired by the database clock. Then A is continued: its write
// completes, it reads the key, renews and releases.
type historyRound struct {
	process   bool // A is a worker process, paused by SIGSTOP (else a goroutine, asleep)
	lapse     bool
	race      bool // B acquires in a transaction held open while C races it
	successor successorWrite
}

// successorWrite is what B writes in a takeover round before reading A's key.
type successorWrite int

const (
	successorWritesNothing successorWrite = iota
	successorWritesOtherKey
	successorWritesSameKey
)

func (h *historyRun) round(n int, r historyRound, a, b, c *historyActor) error {
	la, err := h.acquireUntil(a, historyTTL, nil)
	if err != nil {
		return err
	}
	token, expires := la.token, la.expires
	// C tries to acquire while A holds the lease, concurrently with A's
	// first write.
	taken := false // whether anyone acquired after A
	var wg sync.WaitGroup
	var contErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1 + h.intn(2) {
			g, ok, err := h.tryAcquire(c, historyTTL, nil)
			if err != nil {
				contErr = err
				return
			}
			if ok {
				taken = true
				if _, err := h.release(c, g.token); err != nil {
					contErr = err
				}
				return
			}
			h.jitter(1, 5)
		}
	}()
	key := h.intn(historyKeys)
	if _, err := h.write(a, key, token, h.intn(2) == 0, fmt.Sprintf("r%d-a", n), nil); err != nil {
		return err
	}
	if err := h.read(a, key); err != nil {
		return err
	}
	wg.Wait()
	if contErr != nil {
		return contErr
	}
	if g, out, err := h.renew(a, token, historyTTL); err != nil {
		return err
	} else if out == outcomeOK {
		expires = g.expires
	}

	key = h.intn(historyKeys)
	pw := h.startPausedWrite(a, key, token, h.intn(2) == 0, fmt.Sprintf("r%d-paused", n))
	defer func() { _ = pw.finish() }()
	var lb leaseGrant
	successor := false
	if r.lapse {
		h.mu.Lock()
		h.stats.lapses++
		h.mu.Unlock()
		if err := h.waitClockPast(expires); err != nil {
			return err
		}
	} else {
		lb, err = h.takeover(r, expires, b, c)
		if err != nil {
			return err
		}
		successor, taken = true, true
		switch r.successor {
		case successorWritesNothing:
		case successorWritesOtherKey:
			_, err = h.write(b, 1-key, lb.token, h.intn(2) == 0, fmt.Sprintf("r%d-b", n), nil)
		case successorWritesSameKey:
			_, err = h.write(b, key, lb.token, h.intn(2) == 0, fmt.Sprintf("r%d-b", n), nil)
		}
		if err != nil {
			return err
		}
		// B reads A's key before A continues, which pins A's write after
		// B's acquisition in every linearization.
		if err := h.read(b, key); err != nil {
			return err
		}
	}
	if err := pw.finish(); err != nil {
		return err
	}
	if err := h.read(a, key); err != nil {
		return err
	}
	_, renewed, err := h.renew(a, token, historyTTL)
	if err != nil {
		return err
	}
	released, err := h.release(a, token)
	if err != nil {
		return err
	}
	if taken {
		h.expect(n, "the paused holder's write", pw.out, outcomeStale)
		h.expect(n, "the paused holder's renewal", renewed, outcomeLost)
		h.expect(n, "the paused holder's release", released, outcomeLost)
	} else {
		// The lease only lapsed: a write checked against it is refused,
		// one checked against the fence alone lands.
		want := outcomeOK
		if pw.leased {
			want = outcomeLost
		}
		h.expect(n, "the lapsed holder's write", pw.out, want)
		h.expect(n, "the lapsed holder's renewal", renewed, outcomeLost)
		h.expect(n, "the lapsed holder's release", released, outcomeOK)
	}
	if successor {
		if _, err := h.release(b, lb.token); err != nil {
			return err
		}
	}
	return nil
}

// takeover has B acquire the lease A holds, while C competes: B tries at
// once (a path that lets a held lease be taken shows it here), then B and
// C poll until B has it. In a race round B acquires in a transaction that
// stays open until C's attempt waits for it.
func (h *historyRun) takeover(r historyRound, expires time.Time, b, c *historyActor) (leaseGrant, error) {
	h.mu.Lock()
	h.stats.takeovers++
	h.mu.Unlock()
	if r.race {
		var racer struct {
			won  bool
			err  error
			done chan struct{}
		}
		hold := func(ctx context.Context, pid uint32) {
			if racer.done != nil {
				// An earlier attempt's commit failed (a serialization
				// failure): its racer raced nobody.
				<-racer.done
				if racer.err != nil {
					return
				}
			}
			racer.won = false
			racer.done = make(chan struct{})
			go func() {
				defer close(racer.done)
				g, ok, err := h.tryAcquire(c, historyTTL, nil)
				racer.won, racer.err = ok, err
				if ok {
					_, racer.err = h.release(c, g.token)
				}
			}()
			if h.waitBlockedBy(ctx, pid, racer.done) {
				h.mu.Lock()
				h.stats.racesBlocked++
				h.mu.Unlock()
			}
		}
		// B starts once A's lease has expired, so that it holds its
		// transaction open only briefly (the races of a setup share a few
		// connections).
		if err := h.waitClockPast(expires); err != nil {
			return leaseGrant{}, err
		}
		select {
		case h.races <- struct{}{}:
		case <-h.ctx.Done():
			return leaseGrant{}, h.ctx.Err()
		}
		lb, err := h.acquireUntil(b, historyRaceTTL, hold)
		<-h.races
		if err != nil {
			return lb, err
		}
		if racer.done == nil {
			return lb, errors.New("the successor's acquisition never held its transaction open")
		}
		<-racer.done
		if racer.won {
			h.mu.Lock()
			h.stats.steals++
			h.unexpected = append(h.unexpected, "a racer acquired the lease over a successor's open transaction")
			h.mu.Unlock()
		}
		return lb, racer.err
	}
	if lb, ok, err := h.tryAcquire(b, historyTTL, nil); ok || err != nil {
		return lb, err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var contErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			g, ok, err := h.tryAcquire(c, historyTTL, nil)
			if err != nil {
				contErr = err
				return
			}
			if ok {
				_, contErr = h.release(c, g.token)
				return
			}
			h.jitter(2, 8)
		}
	}()
	time.Sleep(historyTTL / 2)
	lb, err := h.acquireUntil(b, historyTTL, nil)
	close(stop)
	wg.Wait()
	if err == nil {
		err = contErr
	}
	return lb, err
}

// historyResult is one run's history and its verdict.
type historyResult struct {
	check      porcupine.CheckResult
	history    []porcupine.Operation
	stats      historyStats
	unexpected []string
	err        error
}

// historySetup is a migrated database, a pool on it and child worker
// processes connected to it.
type historySetup struct {
	pool *pgxpool.Pool
	// owner is a pool as the database's owner, for the faulty paths'
	// statements, which write pgquota's tables by hand (no pgquota role
	// may).
	owner   *pgxpool.Pool
	workers chan *historyWorker
	races   chan struct{}
}

// newHistorySetup makes a setup whose pool holds at most maxConns
// connections; each worker process holds one more.
func newHistorySetup(t *testing.T, maxConns int32, workers int) *historySetup {
	t.Helper()
	url := pgtest.NewURL(t)
	// As the owner in every mode (also PGQUOTA_TEST_APP_ROLE=1): the
	// faulty paths these tests must catch are hand-made statements on
	// pgquota's tables, which no pgquota role may write.
	s := &historySetup{
		pool:    pgtest.ConnectOwner(t, url, maxConns),
		owner:   pgtest.ConnectOwner(t, url, maxConns),
		workers: make(chan *historyWorker, workers),
		// A race holds three connections: the successor's transaction,
		// the racer's, and the harness's lock-wait query.
		races: make(chan struct{}, max(1, (maxConns-2)/3)),
	}
	for range workers {
		s.workers <- startHistoryWorker(t, url)
	}
	return s
}

// run records and checks one history of variant on resource.
func (s *historySetup) run(ctx context.Context, variant string, store historyStore, resource string, seed uint64) (res historyResult) {
	ctx, cancel := context.WithTimeout(ctx, historyRunTimeout)
	defer cancel()
	h := &historyRun{
		ctx: ctx, resource: resource, rng: rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano()))),
		rec: &historyRecorder{start: time.Now()}, pool: s.pool, races: s.races,
	}
	actors := make([]*historyActor, 4)
	for i := 1; i < len(actors); i++ {
		actors[i] = &historyActor{id: i, holder: fmt.Sprintf("%s-g%d", resource, i), store: store}
	}
	// Four rounds in a random order: the worker process's takeover (the
	// successor writes nothing), a sleeper's takeover (the successor writes
	// a key), a sleeper's lapse, and a sleeper's takeover by a successor
	// that a racer races (it writes the other key or nothing).
	rounds := []historyRound{
		{process: true, successor: successorWritesNothing},
		{successor: successorWritesOtherKey + successorWrite(h.rng.IntN(2))},
		{lapse: true},
		{race: true, successor: successorWrite(h.rng.IntN(2))},
	}
	h.rng.Shuffle(len(rounds), func(i, j int) { rounds[i], rounds[j] = rounds[j], rounds[i] })
	res.err = func() error {
		for n, r := range rounds {
			p := h.rng.Perm(3)
			a, b, c := actors[1+p[0]], actors[1+p[1]], actors[1+p[2]]
			if r.process {
				var w *historyWorker
				select {
				case w = <-s.workers:
				case <-ctx.Done():
					return fmt.Errorf("no worker process came free: %w", ctx.Err())
				}
				a = &historyActor{id: 0, holder: fmt.Sprintf("%s-proc%d", resource, w.pid()), store: historyProcessStore{w: w, variant: variant}, proc: w}
				err := h.round(n, r, a, b, c)
				if cerr := w.cont(); err == nil {
					err = cerr
				}
				s.workers <- w
				if err != nil {
					return fmt.Errorf("round %d (%+v): %w", n, r, err)
				}
				continue
			}
			if err := h.round(n, r, a, b, c); err != nil {
				return fmt.Errorf("round %d (%+v): %w", n, r, err)
			}
		}
		return nil
	}()
	res.history, res.stats, res.unexpected = h.rec.history(), h.stats, h.unexpected
	if res.err == nil {
		res.check = porcupine.CheckOperationsTimeout(fencedLeaseModel, res.history, 20*time.Second)
	}
	return res
}

// runs records n histories of variant concurrently, each on a resource of
// its own.
func (s *historySetup) runs(ctx context.Context, variant string, store historyStore, n int) []historyResult {
	results := make([]historyResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			historyRunSlots <- struct{}{}
			defer func() { <-historyRunSlots }()
			results[i] = s.run(ctx, variant, store, fmt.Sprintf("%s-%d", variant, i), uint64(i))
		}()
	}
	wg.Wait()
	return results
}

// describeHistory prints a history for a failure message.
func describeHistory(ops []porcupine.Operation) string {
	var b strings.Builder
	for _, op := range ops {
		fmt.Fprintf(&b, "  client %d [%6.1f, %6.1f] ms %s\n", op.ClientId, float64(op.Call)/1e6, float64(op.Return)/1e6,
			fencedLeaseModel.DescribeOperation(op.Input, op.Output))
	}
	return b.String()
}

// The real client passes every run: every history is linearizable, the
// paused holders' writes, renewals and releases get exactly the errors the
// library documents, and every run exercised what it should (stale writes
// refused, a child process stopped, a racer waiting on an open
// transaction).
func TestFenceHistoryIsLinearizable(t *testing.T) {
	t.Parallel()
	s := newHistorySetup(t, 4, 1)
	client, err := quota.New(s.pool, nil)
	require.NoError(t, err)
	results := s.runs(context.Background(), historyRealVariant, clientStore{pool: s.pool, client: client}, historyRuns)
	passed := 0
	for i, r := range results {
		require.NoError(t, r.err, "run %d", i)
		require.Equal(t, porcupine.Ok, r.check, "run %d is not linearizable:\n%s", i, describeHistory(r.history))
		require.Empty(t, r.unexpected, "run %d", i)
		require.Positive(t, r.stats.staleRejected, "run %d: the history must include fenced-off writes", i)
		require.Positive(t, r.stats.stops, "run %d: a holder must have been paused by stopping its process", i)
		require.Positive(t, r.stats.sleeps, "run %d: a holder must have been paused by sleeping", i)
		require.Positive(t, r.stats.racesBlocked, "run %d: a racer must have waited on a successor's open transaction", i)
		require.Equal(t, 3, r.stats.takeovers, "run %d", i)
		require.Equal(t, 1, r.stats.lapses, "run %d", i)
		passed++
	}
	t.Logf("real client: %d of %d runs linearizable (%d operations in run 0)", passed, len(results), len(results[0].history))
}

// randomPauses records the workload of the first version of this check:
// six clients, four rounds each, each acquiring the lease (polling), pausing
// (client 0 past the TTL in its first round, every client past it one time
// in four), renewing one time in two, writing a random key, reading it back
// and releasing.
func (s *historySetup) randomPauses(ctx context.Context, store historyStore, resource string) (res historyResult) {
	const clients, rounds = 6, 4
	ctx, cancel := context.WithTimeout(ctx, historyRunTimeout)
	defer cancel()
	h := &historyRun{ctx: ctx, resource: resource, rng: rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano()))),
		rec: &historyRecorder{start: time.Now()}, pool: s.pool, races: s.races}
	errs := make([]error, clients)
	concurrently(clients, func(c int) {
		a := &historyActor{id: c, holder: fmt.Sprintf("%s-c%d", resource, c), store: store}
		errs[c] = func() error {
			for r := range rounds {
				l, err := h.acquireUntil(a, historyTTL, nil)
				if err != nil {
					return err
				}
				if (c == 0 && r == 0) || h.intn(4) == 0 {
					h.jitter(int(historyTTL/time.Millisecond)+50, int(historyTTL/time.Millisecond)+200)
				} else {
					h.jitter(0, 20)
				}
				if h.intn(2) == 0 {
					if _, _, err := h.renew(a, l.token, historyTTL); err != nil {
						return err
					}
				}
				key := h.intn(historyKeys)
				if _, err := h.write(a, key, l.token, h.intn(2) == 0, fmt.Sprintf("c%d-r%d", c, r), nil); err != nil {
					return err
				}
				if err := h.read(a, key); err != nil {
					return err
				}
				if _, err := h.release(a, l.token); err != nil {
					return err
				}
			}
			return nil
		}()
	})
	res.err = errors.Join(errs...)
	res.history, res.stats = h.rec.history(), h.stats
	if res.err == nil {
		res.check = porcupine.CheckOperationsTimeout(fencedLeaseModel, res.history, 20*time.Second)
	}
	return res
}

// The first version's workload, with random pauses and six concurrent
// acquirers, is linearizable on the real client and includes fenced-off
// writes; with the token ignored (a plain upsert) it is not.
func TestFenceHistoryRandomPauses(t *testing.T) {
	t.Parallel()
	s := newHistorySetup(t, 6, 0)
	client, err := quota.New(s.pool, nil)
	require.NoError(t, err)
	base := clientStore{pool: s.pool, client: client}
	real := s.randomPauses(context.Background(), base, "random-real")
	require.NoError(t, real.err)
	require.Equal(t, porcupine.Ok, real.check, "not linearizable:\n%s", describeHistory(real.history))
	require.Positive(t, real.stats.staleRejected, "the history must include fenced-off writes")

	unfenced, err := historyStoreFor("unfenced-write", base)
	require.NoError(t, err)
	res := s.randomPauses(context.Background(), unfenced, "random-unfenced")
	require.NoError(t, res.err)
	require.Equal(t, porcupine.Illegal, res.check, "a stale write landed, so the history must not be linearizable")
}
