package lease

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// DoRequest names the lease Do holds while it runs its function.
type DoRequest struct {
	// Name is the lease's name (AcquireRequest.Name). Required.
	Name string
	// Holder names this process for people reading the lease
	// (AcquireRequest.Holder). Defaults to DefaultHolder().
	Holder string
	// TTL is the lease's time to live, renewed in the background while fn
	// runs (AcquireRequest.TTL). Required: MinTTL to MaxTTL.
	TTL time.Duration
	// Wait makes Do wait while another holder has the lease (AcquireWait,
	// bounded by ctx) instead of returning a *HeldError at once.
	// Defaults to false.
	Wait bool
	// WaitOptions tunes the wait (AcquireWait). Defaults to nil.
	WaitOptions *WaitOptions
	// Keepalive tunes the renewals and the margin by which fn's context
	// ends before the lease's expiry (Keepalive). Its TTL defaults to TTL.
	// Defaults to nil: renew every TTL/3, end fn's context TTL/10 before
	// the last confirmed expiry.
	Keepalive *KeepaliveOptions
	// Payload is stored with the lease (AcquireRequest.Payload). Defaults
	// to none.
	Payload string
	// OnReleaseError, when set, is called with the error of the release
	// that follows fn, if it fails (see Do). Defaults to nil.
	OnReleaseError func(Lease, error)
}

// DefaultHolder names this process for AcquireRequest.Holder: the host
// name (os.Hostname, or "pgquota" when it has none), a colon and the
// process id, e.g. "web-7f9c:4121". It is what an empty Holder of
// AcquireRequest, SlotRequest, DoRequest and ElectionOptions becomes, and
// what the CLI's --holder defaults to. The host name is read once per
// process.
func DefaultHolder() string { return defaultHolder() }

var defaultHolder = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "pgquota"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
})

// holderOrDefault returns holder, or DefaultHolder() when it is empty: the
// one place where every acquire path fills in a missing holder.
func holderOrDefault(holder string) string {
	if holder == "" {
		return DefaultHolder()
	}
	return holder
}

// leaseContextKey is the context key under which Do and Campaign store
// the running lease (a *heldLease).
type leaseContextKey struct{}

// heldLease is what a work context carries: the keeper, for the lease as
// last confirmed, and the payload stored at acquisition (renewals do not
// return it).
type heldLease struct {
	k       *Keeper
	payload string
}

// withLease returns ctx carrying the lease kept by k, acquired with l.
func withLease(ctx context.Context, k *Keeper, l Lease) context.Context {
	return context.WithValue(ctx, leaseContextKey{}, &heldLease{k: k, payload: l.Payload})
}

// FromContext returns the lease under which a function started by Do
// (or a leader's Leadership.Context) runs, as last confirmed by the
// database (its token never changes; its Payload is the one stored at
// acquisition), and true; or false when ctx carries none. Put its Token
// (and Name as fence.WriteRowRequest.Lease) on every write the work makes, so
// that a write made after the lease was lost is rejected where it lands.
func FromContext(ctx context.Context) (Lease, bool) {
	h, ok := ctx.Value(leaseContextKey{}).(*heldLease)
	if !ok {
		return Lease{}, false
	}
	l := h.k.Lease()
	l.Payload = h.payload
	return l, true
}

// releaseTimeout bounds the release after fn, which runs even when the
// caller's context has ended.
const releaseTimeout = 5 * time.Second

// Do runs fn while holding the lease req.Name: it acquires the lease
// (waiting for it with req.Wait), keeps it alive in the background
// (Keepalive), runs fn with a context that ends before the lease can
// expire by the database clock and that carries the lease
// (FromContext), and releases the lease when fn returns (or panics),
// so the next holder can start at once. The shape of etcd's
// concurrency.Mutex and of the DynamoDB lock client's acquire, run,
// release.
//
// fn's context ends, with context.Cause telling why, when the lease is
// lost or about to expire without a confirmed renewal (ErrLost,
// ErrExpiring; see Keepalive), or when ctx ends. fn must then stop:
// its writes fenced with the lease's token are rejected once another
// holder has the lease (the guarantee that a stale holder never writes), but its other effects are
// not. Do waits for fn to return whatever happens.
//
// Returns:
//   - fn's error, as is, when fn ran; nil when fn returned nil. Whether
//     the lease was held until the end is context.Cause of fn's context:
//     fn returns it when that matters.
//   - A release that fails after fn never changes that result, so a caller
//     never runs fn again for a failed release: the lease then expires by
//     itself within its TTL (renewals stopped before the release), and the
//     error goes to req.OnReleaseError.
//   - Before fn runs: *quota.InputError (quota.ErrInvalidInput) for a bad name, holder,
//     TTL, payload or Keepalive option (nothing written); *HeldError
//     (ErrHeld) when another holder has the lease and req.Wait is
//     false; with req.Wait, AcquireWait's error when ctx ends first; the
//     errors of Keepalive's first renewal (the lease is then released);
//     quota.ErrSchemaMissing; database errors. fn did not run.
func (c *Client) Do(ctx context.Context, req DoRequest, fn func(ctx context.Context) error) error {
	if fn == nil {
		return core.Invalid("fn", "must not be nil")
	}
	k, l, err := c.holdLease(ctx, ctx, req.Name, req.Holder, req.TTL, req.Wait, req.WaitOptions, req.Keepalive, req.Payload)
	if err != nil {
		return err
	}
	defer func() {
		_ = k.Stop()
		l := k.Lease()
		if _, err := c.releaseAfter(ctx, l); err != nil && req.OnReleaseError != nil {
			req.OnReleaseError(l, err)
		}
	}()
	return fn(withLease(k.Context(), k, l))
}

// releaseAfter releases l under ctx without its cancellation, bounded by
// releaseTimeout: the release must run also when ctx has ended.
func (c *Client) releaseAfter(ctx context.Context, l Lease) (Lease, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return c.Release(rctx, l)
}

// holdLease validates, acquires (waiting or not) under ctx and starts a
// keeper whose context derives from keepCtx; it returns the keeper and the
// lease as acquired. On an error after the acquire it releases the lease.
func (c *Client) holdLease(ctx, keepCtx context.Context, name, holder string, ttl time.Duration, wait bool,
	wopts *WaitOptions, kopts *KeepaliveOptions, payload string,
) (*Keeper, Lease, error) {
	req := AcquireRequest{Name: name, Holder: holder, TTL: ttl, Payload: payload}
	if err := checkAcquire(&req); err != nil {
		return nil, Lease{}, err
	}
	var o KeepaliveOptions
	if kopts != nil {
		o = *kopts
	}
	if o.TTL == 0 {
		o.TTL = ttl
	}
	if err := checkKeepaliveOptions(o); err != nil {
		return nil, Lease{}, err
	}
	var l Lease
	var err error
	if wait {
		l, err = c.AcquireWait(ctx, req, wopts)
	} else {
		l, err = c.Acquire(ctx, req)
	}
	if err != nil {
		return nil, Lease{}, err
	}
	k, err := c.Keepalive(keepCtx, l, &o)
	if err != nil {
		_, _ = c.releaseAfter(ctx, l)
		return nil, Lease{}, err
	}
	return k, l, nil
}

// checkKeepaliveOptions checks o (TTL set) as Keepalive does, before
// anything is acquired, so that bad options write nothing.
func checkKeepaliveOptions(o KeepaliveOptions) error {
	if err := checkTTL(o.TTL); err != nil {
		return err
	}
	margin := o.Margin
	if margin == 0 {
		margin = o.TTL / 10
	}
	if margin < 0 || margin >= o.TTL {
		return core.Invalid("margin", "must be at least 0 and below the TTL %s, got %s", o.TTL, margin)
	}
	every := o.Interval
	if every == 0 {
		every = o.TTL / 3
	}
	if every <= 0 || every >= o.TTL-margin {
		return core.Invalid("interval", "must be positive and below TTL - margin (%s), got %s", o.TTL-margin, every)
	}
	return nil
}
