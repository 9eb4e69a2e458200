package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// Leader election on a lease, as etcd's concurrency.Election and Apache
// Curator's LeaderLatch offer it: the leader is whoever holds the
// election's lease. A campaigner blocks until it takes the lease, then
// stays leader through keepalive until it resigns or loses the lease (a
// pause past the TTL, a lost database), and its Leadership's context tells
// it the moment it must stop acting as leader. The lease's token is the
// leader's fencing token: a deposed leader that still acts (it was paused
// and has not looked at its context yet) has its fenced writes rejected
// (the guarantee that a stale holder never writes). The leader's value (etcd's campaign value, an
// address for the followers) is the lease's payload.

// ElectionOptions configures an Election.
type ElectionOptions struct {
	// Holder names this campaigner (AcquireRequest.Holder). Defaults to
	// DefaultHolder().
	Holder string
	// TTL is the leadership lease's time to live: a leader that stops
	// renewing (a crash, a pause) loses leadership at most TTL later by the
	// database clock. MinTTL to MaxTTL. Required.
	TTL time.Duration
	// WaitOptions tunes how Campaign waits for the lease (AcquireWait).
	// Defaults to nil.
	WaitOptions *WaitOptions
	// Keepalive tunes the leader's renewals (Keepalive); its TTL defaults
	// to TTL. Defaults to nil.
	Keepalive *KeepaliveOptions
}

// Election is a leader election on the lease of its name. Create it with
// Client.NewElection; it is safe for concurrent use, and one Election may
// campaign any number of times (one term after another).
type Election struct {
	c    *Client
	name string
	opts ElectionOptions
}

// NewElection returns the election on lease name. It does not touch the
// database.
//
// Errors: *quota.InputError for a bad name, holder, TTL or Keepalive option.
func (c *Client) NewElection(name string, opts ElectionOptions) (*Election, error) {
	if err := core.CheckName("lease name", name); err != nil {
		return nil, err
	}
	opts.Holder = holderOrDefault(opts.Holder)
	if err := core.CheckName("holder", opts.Holder); err != nil {
		return nil, err
	}
	if err := checkTTL(opts.TTL); err != nil {
		return nil, err
	}
	var o KeepaliveOptions
	if opts.Keepalive != nil {
		o = *opts.Keepalive
	}
	if o.TTL == 0 {
		o.TTL = opts.TTL
	}
	if err := checkKeepaliveOptions(o); err != nil {
		return nil, err
	}
	return &Election{c: c, name: name, opts: opts}, nil
}

// Name returns the election's lease name.
func (e *Election) Name() string { return e.name }

// Leadership is one term of a campaigner as leader, from Campaign until it
// resigns or loses the lease.
type Leadership struct {
	e   *Election
	k   *Keeper
	ctx context.Context

	resignOnce sync.Once
	resignErr  error
}

// Campaign blocks until this campaigner is the leader (it holds the
// election's lease) or ctx ends, then keeps the lease alive in the
// background and returns the term, which lasts until Resign or until the
// lease is lost: ctx bounds the wait only, so a timeout for getting
// elected does not end the term (etcd's Campaign alike). Resign when
// shutting down, so the next leader takes over at once. value is stored
// as the lease's payload
// (the leader's value for Leader and Observe; may be empty). Campaigners
// wait in no particular order; a resigning leader hands over at once (its
// release wakes the waiters), a crashed one within the TTL.
//
// Errors: *quota.InputError for a bad value (see AcquireRequest.Payload); when
// ctx ends first, AcquireWait's error (wrapping ctx's cause);
// quota.ErrSchemaMissing; database errors.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	// The term outlives ctx, which bounds the wait only (as in etcd, where
	// leadership lasts as long as the session, not the campaign's context).
	k, l, err := e.c.holdLease(ctx, context.WithoutCancel(ctx), e.name, e.opts.Holder, e.opts.TTL, true,
		e.opts.WaitOptions, e.opts.Keepalive, value)
	if err != nil {
		return nil, err
	}
	return &Leadership{e: e, k: k, ctx: withLease(k.Context(), k, l)}, nil
}

// Context returns a context that ends when this term ends: the lease was
// lost or is about to expire without a confirmed renewal (cause wrapping
// ErrLost or ErrExpiring), or Resign was called
// (ErrKeepaliveStopped). It carries the lease (FromContext) and the
// values of Campaign's ctx. Act as leader only under it.
func (t *Leadership) Context() context.Context { return t.ctx }

// Done is closed when the term has ended (Context is done and renewals have
// stopped).
func (t *Leadership) Done() <-chan struct{} { return t.k.Done() }

// Lease returns the leadership lease as last confirmed by the database.
func (t *Leadership) Lease() Lease { return t.k.Lease() }

// Token returns the leader's fencing token: pass it on every write the
// leader makes (fence.WriteRowRequest.Token, with Lease set to the election's
// name).
func (t *Leadership) Token() int64 { return t.k.Lease().Token }

// Proclaim replaces the leader's value (the lease's payload) without giving
// up leadership, as etcd's Election.Proclaim.
//
// Errors: those of SetPayload; ErrLost when this term has ended.
func (t *Leadership) Proclaim(ctx context.Context, value string) error {
	l := t.k.Lease()
	_, err := t.e.c.SetPayload(ctx, l, value)
	return err
}

// Resign ends the term: it stops the renewals, ends Context, and releases
// the lease so another campaigner becomes leader at once. Calling it again
// returns the same.
//
// Errors: nil when the lease was released, or had already been lost or
// taken over (the term had ended anyway); otherwise the release's database
// error, after which the lease expires by itself within the TTL (no
// renewals run any more).
func (t *Leadership) Resign(ctx context.Context) error {
	t.resignOnce.Do(func() {
		_ = t.k.Stop()
		l := t.k.Lease()
		_, err := t.e.c.releaseAfter(ctx, l)
		if errors.Is(err, ErrLost) {
			err = nil
		}
		t.resignErr = err
	})
	return t.resignErr
}

// Leader returns the current leader's lease (holder, Token, payload as the
// leader's value) in one read, judged by the database clock.
//
// Errors: ErrNoLeader when nobody holds the lease (never won, resigned or
// lost: the returned Lease is then the last term's row, Held false, or the
// zero Lease when there never was one); quota.ErrSchemaMissing; database errors.
func (e *Election) Leader(ctx context.Context) (Lease, error) {
	l, err := e.c.Get(ctx, e.name)
	switch {
	case errors.Is(err, ErrNotFound):
		return Lease{}, ErrNoLeader
	case err != nil:
		return Lease{}, err
	case !l.Held:
		return l, ErrNoLeader
	}
	return l, nil
}

// Observe watches the election by polling Leader every interval (at least
// MinTTL): the returned channel receives the election's lease each
// time the leader changes (another token or holder, a new value, or the
// lease no longer held: Held false means no leader), starting with the
// current state once a lease of that name exists. It is closed when ctx
// ends. Reads that fail are retried at the next tick; a leader that comes
// and goes between two polls is not seen. Polling keeps it safe behind a
// transaction-mode pooler.
func (e *Election) Observe(ctx context.Context, interval time.Duration) <-chan Lease {
	interval = max(interval, MinTTL)
	ch := make(chan Lease)
	go func() {
		defer close(ch)
		var last Lease
		seen := false
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			l, err := e.c.Get(ctx, e.name)
			if err == nil && (!seen || l.Token != last.Token || l.Held != last.Held ||
				l.Holder != last.Holder || l.Payload != last.Payload) {
				select {
				case ch <- l:
					last, seen = l, true
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ch
}
