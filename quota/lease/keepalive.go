package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/pgquota/pgquota/internal/core"
)

// KeepaliveOptions tunes Keepalive. The zero value (or nil) is ready to
// use.
type KeepaliveOptions struct {
	// TTL is what each renewal asks for. Defaults to the lease's own TTL
	// (ExpiresAt - RenewedAt).
	TTL time.Duration
	// Interval is the time between renewals, counted from the moment the
	// last successful renewal was sent. It must be below TTL - Margin.
	// Defaults to TTL/3, so two renewals can fail before the deadline.
	Interval time.Duration
	// Margin is how long before the last expiry the database confirmed the
	// work context ends when no renewal has succeeded since. It must be
	// below TTL. It absorbs the time between the context ending and the
	// work noticing, and any difference in the rates of the two clocks.
	// Defaults to TTL/10.
	Margin time.Duration
	// AttemptTimeout bounds each renewal attempt (connecting included): an
	// attempt that has no answer by then is abandoned, and the next one
	// runs on a connection opened for it, so one connection that went
	// silent (packets dropped, no reset) does not use up the window. It
	// must be positive and below TTL - Margin. Defaults to Interval/2.
	AttemptTimeout time.Duration
	// OnRenew, when set, is called after every renewal attempt with the
	// renewed lease or the error, from the keeper's goroutine. It must not
	// block.
	OnRenew func(Lease, error)

	// beforeRenew is a test hook: called before each renewal with its
	// context; an error it returns replaces the renewal.
	beforeRenew func(ctx context.Context) error
}

// Keeper renews a lease in the background and ends a work context before
// the lease can expire. Create it with Client.Keepalive.
type Keeper struct {
	c      *Client
	name   string
	token  int64
	ttl    time.Duration
	every  time.Duration
	margin time.Duration
	// attempt bounds each renewal attempt.
	attempt time.Duration
	opts    KeepaliveOptions

	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}

	mu      sync.Mutex
	lease   Lease
	lastErr error
	timer   *time.Timer // fires at the deadline
}

// Keepalive starts renewing lease l (as returned by Acquire, AcquireWait,
// Renew or Get) every opts.Interval, and returns a Keeper whose Context,
// derived from ctx, is the holder's work context.
//
// The work context is cancelled no later than the last expiry the database
// confirmed, minus opts.Margin. That deadline is measured with the local
// monotonic clock from the moment the confirming statement was sent (the
// database read its clock after that moment, so the lease cannot expire
// earlier, whatever the offset between the two clocks): deadline = sent +
// (ExpiresAt - DBNow) - Margin, where ExpiresAt and DBNow are both read from
// the database clock in the same statement. Local wall-clock time is never
// compared with a database timestamp.
//
// A failed renewal is retried with jittered backoff inside the window, so a
// single transient failure (a killed connection, a failover) does not end
// the work. Each renewal attempt is bounded by opts.AttemptTimeout and by
// the deadline, so an attempt that hangs (a connection that went silent,
// its packets dropped without a reset) is abandoned well before the
// deadline, and cannot keep the work going past it either. pgx closes a
// connection whose statement it abandoned; after a failure that the server
// did not report (a timeout, a broken connection), the next attempt runs
// on a connection opened for it with the pool's connection settings (and
// closed after), since the pool's other idle connections may be as dead as
// the last one. The work context ends, with context.Cause telling why,
// when:
//   - the deadline passes without a confirmed renewal: a cause wrapping
//     ErrExpiring and the last renewal error;
//   - a renewal finds the lease lost (expired, released or taken over): a
//     cause wrapping ErrLost;
//   - Stop is called: ErrKeepaliveStopped;
//   - ctx ends: ctx's cause.
//
// When l's remaining time is unknown or shorter than the margin, Keepalive
// renews once before returning.
//
// Errors: *quota.InputError for a lease without name or token, or bad options;
// the errors of Renew from that first renewal.
func (c *Client) Keepalive(ctx context.Context, l Lease, opts *KeepaliveOptions) (*Keeper, error) {
	if err := core.CheckName("lease name", l.Name); err != nil {
		return nil, err
	}
	if err := checkToken(l.Token); err != nil {
		return nil, err
	}
	k := &Keeper{c: c, name: l.Name, token: l.Token}
	if opts != nil {
		k.opts = *opts
	}
	k.ttl = k.opts.TTL
	if k.ttl == 0 {
		k.ttl = l.ExpiresAt.Sub(l.RenewedAt)
	}
	if err := checkTTL(k.ttl); err != nil {
		return nil, err
	}
	k.margin = k.opts.Margin
	if k.margin == 0 {
		k.margin = k.ttl / 10
	}
	if k.margin < 0 || k.margin >= k.ttl {
		return nil, core.Invalid("margin", "must be at least 0 and below the TTL %s, got %s", k.ttl, k.margin)
	}
	k.every = k.opts.Interval
	if k.every == 0 {
		k.every = k.ttl / 3
	}
	if k.every <= 0 || k.every >= k.ttl-k.margin {
		return nil, core.Invalid("interval", "must be positive and below TTL - margin (%s), got %s", k.ttl-k.margin, k.every)
	}
	k.attempt = k.opts.AttemptTimeout
	if k.attempt == 0 {
		k.attempt = k.every / 2
	}
	if k.attempt <= 0 || k.attempt >= k.ttl-k.margin {
		return nil, core.Invalid("attempt timeout", "must be positive and below TTL - margin (%s), got %s", k.ttl-k.margin, k.attempt)
	}

	if l.ValidUntil().Add(-k.margin).Before(time.Now()) {
		renewed, err := k.renew(ctx)
		if err != nil {
			return nil, err
		}
		l = renewed
	}

	k.ctx, k.cancel = context.WithCancelCause(ctx)
	k.done = make(chan struct{})
	k.lease = l
	k.timer = time.AfterFunc(time.Until(k.deadline(l)), k.expire)
	go k.run()
	return k, nil
}

// Context returns the work context: do the lease's work under it, and stop
// when it ends.
func (k *Keeper) Context() context.Context { return k.ctx }

// Lease returns the lease as last confirmed by the database.
func (k *Keeper) Lease() Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}

// Done is closed when the keeper has stopped renewing (its context ended).
func (k *Keeper) Done() <-chan struct{} { return k.done }

// Stop stops renewing, ends the work context with cause
// ErrKeepaliveStopped, and waits for the keeper's goroutine. It does not
// release the lease. It returns the context's cause when the work context
// had already ended for another reason (the lease lost or about to expire,
// ctx ended), and nil otherwise. Calling it again returns the same.
func (k *Keeper) Stop() error {
	k.mu.Lock()
	ended := context.Cause(k.ctx)
	k.timer.Stop()
	k.mu.Unlock()
	k.cancel(ErrKeepaliveStopped)
	<-k.done
	if ended == nil || errors.Is(ended, ErrKeepaliveStopped) {
		return nil
	}
	return ended
}

// deadline is when the work context must end if l is the last confirmed
// state of the lease.
func (k *Keeper) deadline(l Lease) time.Time {
	return l.ValidUntil().Add(-k.margin)
}

// expire runs when the deadline passes.
func (k *Keeper) expire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	cause := core.Errorf("%w: lease %q, token %d: no renewal confirmed %s before its expiry at %s",
		ErrExpiring, k.name, k.token, k.margin, k.lease.ExpiresAt.UTC().Format(time.RFC3339Nano))
	if k.lastErr != nil {
		cause = core.Errorf("%w (last renewal error: %w)", cause, k.lastErr)
	}
	k.c.core.M.KeepaliveExpired()
	k.cancel(cause)
}

func (k *Keeper) renew(ctx context.Context) (Lease, error) {
	if k.opts.beforeRenew != nil {
		if err := k.opts.beforeRenew(ctx); err != nil {
			return Lease{}, err
		}
	}
	return k.c.Renew(ctx, Lease{Name: k.name, Token: k.token}, k.ttl)
}

// renewOnNewConn renews on a connection opened for this attempt, with the
// pool's connection settings, bounded by ctx.
func (k *Keeper) renewOnNewConn(ctx context.Context) (Lease, error) {
	if k.opts.beforeRenew != nil {
		if err := k.opts.beforeRenew(ctx); err != nil {
			return Lease{}, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, k.c.core.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return Lease{}, core.Errorf("pgquota: renew lease %q: connect: %w", k.name, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	return k.c.renew(ctx, conn, k.name, k.token, k.ttl)
}

func (k *Keeper) run() {
	defer close(k.done)
	retry := &backoff.ExponentialBackOff{
		InitialInterval:     max(k.every/16, time.Millisecond),
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max(k.every/2, time.Millisecond),
	}
	retry.Reset()
	next := k.lease.sent.Add(k.every)
	wait := time.NewTimer(time.Until(next))
	defer wait.Stop()
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-wait.C:
		}
		k.mu.Lock()
		deadline := k.deadline(k.lease)
		lastErr := k.lastErr
		k.mu.Unlock()
		rctx, cancel := context.WithDeadline(k.ctx, deadline)
		rctx, cancelAttempt := context.WithTimeout(rctx, k.attempt)
		var l Lease
		var err error
		if lastErr != nil && isTransient(lastErr) {
			// The last attempt failed without the server's word: it may
			// have hung on a dead connection, and the pool's other idle
			// ones may be dead too.
			l, err = k.renewOnNewConn(rctx)
		} else {
			l, err = k.renew(rctx)
		}
		cancelAttempt()
		cancel()
		if k.opts.OnRenew != nil {
			k.opts.OnRenew(l, err)
		}
		if err == nil {
			k.mu.Lock()
			if !k.timer.Stop() {
				// The deadline passed meanwhile: the context is ending.
				k.mu.Unlock()
				return
			}
			k.lease = l
			k.lastErr = nil
			k.timer.Reset(time.Until(k.deadline(l)))
			k.mu.Unlock()
			retry.Reset()
			wait.Reset(time.Until(l.sent.Add(k.every)))
			continue
		}
		if errors.Is(err, ErrLost) || errors.Is(err, core.ErrInvalidInput) || errors.Is(err, core.ErrSchemaMissing) {
			k.mu.Lock()
			k.timer.Stop()
			k.mu.Unlock()
			k.cancel(err)
			return
		}
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
		wait.Reset(retry.NextBackOff())
	}
}
