package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// The fenced lock (after Martin Kleppmann, "How to do
// distributed locking", 2016): a lease grants its holder a fencing token,
// a number that strictly increases with every acquisition; every write the
// holder makes carries the token, and the storage rejects a token lower
// than one it has already seen (fence.go). A lease alone is not enough: a
// holder paused past its TTL (a GC pause, a stalled VM) wakes up believing
// it still holds the lease; its writes must be stopped where they land.
//
// Every expiry is judged by the database clock (pgquota.clock(), that is
// clock_timestamp(), read inside each statement), never by the
// application's clock, so clock skew between application servers cannot
// make two of them hold one lease. No call here uses session-level advisory
// locks or other session state, except AcquireWait's LISTEN, which
// quota.Config.Pooler = quota.PoolerTransaction (or WaitOptions.NoListen) turns off.

// Bounds of a lease's TTL.
const (
	// MinTTL is the shortest TTL accepted: 1 ms. A smaller one is almost
	// certainly a unit mistake (30 instead of 30*time.Second).
	MinTTL = core.MinLeaseTTL
	// MaxTTL is the longest TTL accepted: 24 h.
	MaxTTL = core.MaxLeaseTTL
)

// NotifyChannel is the PostgreSQL NOTIFY channel on which a release
// announces the lease's name (the payload), so that AcquireWait wakes
// early. A release announces it only when a waiter is registered for the
// lease (AcquireWait registers itself in pgquota.lease_waiter while it
// waits), or when it runs in a REPEATABLE READ or SERIALIZABLE
// transaction: NOTIFY takes a database-wide lock at commit, held through
// the WAL flush, which serialised all releases
// (migrations/00013_lease_waiter.sql).
const NotifyChannel = "pgquota_lease"

// AcquireRequest asks for a lease.
type AcquireRequest struct {
	// Name identifies the lease, typically the resource it protects: 1 to
	// quota.MaxNameBytes bytes, no control characters.
	Name string
	// Holder names the process asking, for people reading `pgquota lease
	// show` (a host name and pid, a pod name). It is not an identity: two
	// processes with the same Holder are still two acquisitions with two
	// tokens. 1 to quota.MaxNameBytes bytes, no control characters. Defaults to
	// DefaultHolder() (host:pid, as the CLI's --holder and DoRequest.Holder)
	// when empty.
	Holder string
	// TTL is how long the lease lasts from the database clock's current
	// instant unless renewed: at least MinTTL, at most MaxTTL.
	// The database stores it to the microsecond.
	TTL time.Duration
	// Attempt identifies this acquisition attempt. Calling Acquire again
	// with the same Attempt while the lease it took is held returns that
	// same lease and token (a retry after a lost reply); any other Attempt
	// gets ErrHeld, and a later successful acquisition gets a new,
	// larger token. Empty means a fresh random attempt per call: set it
	// (NewAttempt) when the call may be retried. 1 to quota.MaxNameBytes bytes.
	Attempt string
	// Payload is data stored with the lease for this acquisition (see
	// SetPayload), read back by Get and List: valid UTF-8 without
	// NUL, at most MaxPayloadBytes bytes. A new acquisition starts
	// without the previous holder's payload. Empty means none; with one,
	// the acquire statement and the payload's are one transaction.
	Payload string
}

// NewAttempt returns a random acquisition attempt id for
// AcquireRequest.Attempt: 32 hexadecimal digits (128 random bits).
func NewAttempt() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Lease is a lease row as the database last reported it.
type Lease struct {
	Name    string `json:"name"`
	Holder  string `json:"holder"`
	Attempt string `json:"attempt"`
	// Token is the fencing token of this acquisition. It is the same for
	// the whole lease (renewals keep it) and larger than every token issued
	// before it, for any lease: tokens come from one bigint sequence that
	// never wraps.
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquired_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	// ExpiresAt is when the lease ends by the database clock, unless
	// renewed.
	ExpiresAt time.Time `json:"expires_at"`
	// DBNow is the database clock's reading in the statement that returned
	// this lease.
	DBNow time.Time `json:"db_now"`
	// Held reports whether the lease was held at DBNow (ExpiresAt after
	// DBNow).
	Held bool `json:"held"`
	// Payload is the data stored with this acquisition (AcquireRequest.
	// Payload, SetPayload); empty when none. Acquire, Get, List
	// and SetPayload fill it; Renew and Release leave it empty.
	Payload string `json:"payload"`

	// sent is the local time, with its monotonic reading, at which the
	// statement that returned this lease was sent. The database read its
	// clock after that moment.
	sent time.Time
}

// Remaining is the time the lease had left when it was read, by the
// database clock alone (ExpiresAt - DBNow), or 0 when it had expired.
func (l Lease) Remaining() time.Duration {
	return max(l.ExpiresAt.Sub(l.DBNow), 0)
}

// ValidUntil returns a local time before which the lease is still held by
// the database clock, assuming only that both clocks tick at the same rate
// (no assumption about their offset): the moment the statement that
// returned the lease was sent, by the local monotonic clock, plus
// Remaining. Compare it with time.Now(), never with a database timestamp.
// It is the zero time for a Lease this package did not return.
func (l Lease) ValidUntil() time.Time {
	if l.sent.IsZero() {
		return time.Time{}
	}
	return l.sent.Add(l.Remaining())
}

// HeldError is returned by Acquire when another attempt holds the
// lease. It wraps ErrHeld.
type HeldError struct {
	// Name is the lease's name.
	Name string
	// Holder is the current holder's name.
	Holder string
	// ExpiresAt is when the current holder's lease expires by the database
	// clock, unless renewed.
	ExpiresAt time.Time
	// Remaining is ExpiresAt minus the database clock's reading in the
	// acquire statement.
	Remaining time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("pgquota: lease %q is held by %q until %s (%s left)",
		e.Name, e.Holder, e.ExpiresAt.UTC().Format(time.RFC3339Nano), e.Remaining.Round(time.Millisecond))
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

func checkTTL(ttl time.Duration) error { return core.CheckTTL(ttl) }

func checkToken(token int64) error { return core.CheckToken(token) }

func intervalOf(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

func checkAcquire(req *AcquireRequest) error {
	if err := core.CheckName("lease name", req.Name); err != nil {
		return err
	}
	req.Holder = holderOrDefault(req.Holder)
	if err := core.CheckName("holder", req.Holder); err != nil {
		return err
	}
	if err := checkTTL(req.TTL); err != nil {
		return err
	}
	if req.Attempt == "" {
		req.Attempt = NewAttempt()
	}
	if err := checkPayload(req.Payload); err != nil {
		return err
	}
	return core.CheckName("attempt", req.Attempt)
}

// Acquire takes the lease req.Name for req.TTL when it is free (never
// acquired, released, or expired by the database clock), in one SQL
// statement and one round trip, and returns it with a new fencing token and
// the database's expiry. Concurrent acquirers of a free lease get exactly
// one winner (see queries/lease.sql). Repeating the call with the same
// req.Attempt while that attempt's lease is held returns the same lease and
// token.
//
// A lease's name is also a fence resource: taking the lease with token T
// raises the highest token seen for the resource of the same name to T in
// the same statement. From then on no write carrying an older token lands
// on that resource (fence.Client.WriteRow on it, or a table guarded by
// fence.Client.GuardTable whose fence.GuardedTable.Resource it is), even before the new
// holder writes anything: the storage half of Kleppmann's fencing (2016)
// learns of the new holder when the lock half does.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) for a bad name, holder, TTL,
// attempt or payload; *HeldError (ErrHeld) when another attempt holds it;
// quota.ErrSchemaMissing; database errors; quota.ErrOutcomeUnknown (below). Nothing is
// written on any other error.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call with the same req.Attempt
// (set it with NewAttempt before the first call): it returns the lease when
// that attempt took it; with a random Attempt, read it with Get.
func (c *Client) Acquire(ctx context.Context, req AcquireRequest) (_ Lease, err error) {
	defer c.core.M.LeaseDone(ctx, core.OpAcquire, c.core.M.Now(), &err)
	if err := checkAcquire(&req); err != nil {
		return Lease{}, err
	}
	return core.Retry(ctx, c.core.Policy, func() (Lease, error) { return c.acquire(ctx, c.core.DB.Pool, req) })
}

// AcquireTx is Acquire inside the caller's transaction: the lease is taken
// when tx commits, and other acquirers wait for tx meanwhile. Its TTL runs
// from the statement, not from the commit.
func (c *Client) AcquireTx(ctx context.Context, tx pgx.Tx, req AcquireRequest) (_ Lease, err error) {
	defer c.core.M.LeaseDone(ctx, core.OpAcquire, c.core.M.Now(), &err)
	if err := checkAcquire(&req); err != nil {
		return Lease{}, err
	}
	return c.acquire(ctx, tx, req)
}

func (c *Client) acquire(ctx context.Context, x db.DBTX, req AcquireRequest) (Lease, error) {
	if req.Payload != "" {
		return c.acquireWithPayload(ctx, x, req) // lease_payload.go
	}
	// A lease released or expired between the statement's snapshot and its
	// fresh read shows up as "not taken, but free": try again, a few times.
	for range 3 {
		sent := time.Now()
		rows, err := c.core.Queries.LeaseAcquire(ctx, x, db.LeaseAcquireParams{
			Name: req.Name, Holder: req.Holder, Attempt: req.Attempt, Ttl: intervalOf(req.TTL),
		})
		if err != nil {
			return Lease{}, core.DBError("acquire lease", err)
		}
		if len(rows) == 0 {
			continue
		}
		r := rows[0]
		l := leaseFrom(db.PgquotaLease{
			Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
			AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
		}, r.DbNow, sent)
		if r.Taken {
			return l, nil
		}
		if !l.Held {
			continue
		}
		return Lease{}, &HeldError{Name: l.Name, Holder: l.Holder, ExpiresAt: l.ExpiresAt, Remaining: l.Remaining()}
	}
	return Lease{}, &HeldError{Name: req.Name, Holder: "(changing hands)"}
}

func leaseFrom(r db.PgquotaLease, dbNow pgtype.Timestamptz, sent time.Time) Lease {
	l := Lease{
		Name:       r.Name,
		Holder:     r.Holder,
		Attempt:    r.Attempt,
		Token:      r.Token,
		AcquiredAt: core.TimeFromPG(r.AcquiredAt),
		RenewedAt:  core.TimeFromPG(r.RenewedAt),
		ExpiresAt:  core.TimeFromPG(r.ExpiresAt),
		DBNow:      core.TimeFromPG(dbNow),
		sent:       sent,
	}
	l.Held = l.ExpiresAt.After(l.DBNow)
	return l
}

// Renew extends lease l (its Name and Token; the other fields are not
// read, so Lease{Name: n, Token: t} will do) to ttl from the database
// clock's current instant, in one statement. The token stays the same. A
// lease that has expired by the database clock cannot be renewed, even when
// nobody took it over, and even from inside a long transaction (the clock
// keeps moving inside one). The clock is read once the statement holds the
// lease row's lock: a renew that waited for it (another session's FOR
// UPDATE, a fenced write's FOR SHARE) extends the lease by ttl from the end
// of the wait, or finds it expired, so a returned Lease with Held set is
// held for its Remaining time by the database (see queries/lease.sql).
//
// Errors: *quota.InputError for a bad name, token or TTL; ErrLost when the
// lease is not held with token (expired, released, or taken over; the
// successor's lease is left as it is); quota.ErrSchemaMissing; database errors.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call (renewing again with the
// token is harmless).
func (c *Client) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	return c.renew(ctx, c.core.DB, l.Name, l.Token, ttl)
}

// RenewTx is Renew inside the caller's transaction.
func (c *Client) RenewTx(ctx context.Context, tx pgx.Tx, l Lease, ttl time.Duration) (Lease, error) {
	return c.renew(ctx, tx, l.Name, l.Token, ttl)
}

func (c *Client) renew(ctx context.Context, x db.DBTX, name string, token int64, ttl time.Duration) (_ Lease, err error) {
	defer c.core.M.LeaseDone(ctx, core.OpRenew, c.core.M.Now(), &err)
	if err := core.CheckName("lease name", name); err != nil {
		return Lease{}, err
	}
	if err := checkToken(token); err != nil {
		return Lease{}, err
	}
	if err := checkTTL(ttl); err != nil {
		return Lease{}, err
	}
	sent := time.Now()
	r, err := c.core.Queries.LeaseRenew(ctx, x, db.LeaseRenewParams{Name: name, Token: token, Ttl: intervalOf(ttl)})
	if core.IsNoRows(err) {
		return Lease{}, c.leaseLost(ctx, x, "renew", name, token)
	}
	if err != nil {
		return Lease{}, core.DBError("renew lease", err)
	}
	c.core.M.Renewed(ctx, r.PrevExpiresAt, r.DbNow)
	return leaseFrom(db.PgquotaLease{
		Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
	}, r.DbNow, sent), nil
}

// leaseLost builds the ErrLost error for a renew or release that
// matched no row, saying what became of the lease.
func (c *Client) leaseLost(ctx context.Context, x db.DBTX, op, name string, token int64) error {
	r, err := c.core.Queries.LeaseGet(ctx, core.ReadsOf(x), name)
	switch {
	case core.IsNoRows(err):
		return core.Errorf("%w: cannot %s lease %q with token %d: it does not exist", ErrLost, op, name, token)
	case err != nil:
		return core.Errorf("%w: cannot %s lease %q with token %d (%w)", ErrLost, op, name, token, core.DBError("read lease", err))
	case r.Token != token && r.ExpiresAt.Time.After(r.DbNow.Time):
		return core.Errorf("%w: cannot %s lease %q with token %d: %q holds it with token %d", ErrLost, op, name, token, r.Holder, r.Token)
	case r.Token != token:
		return core.Errorf("%w: cannot %s lease %q with token %d: it was acquired since with token %d", ErrLost, op, name, token, r.Token)
	default:
		// Release ends a lease by setting its expiry to the release time,
		// so the row cannot tell a release from an expiry.
		return core.Errorf("%w: cannot %s lease %q with token %d: it was released or expired at %s", ErrLost, op, name, token, r.ExpiresAt.Time.UTC().Format(time.RFC3339Nano))
	}
}

// Release ends lease l (its Name and Token; the other fields are not read,
// so Lease{Name: n, Token: t} will do) now, so that the next
// Acquire succeeds at once, and wakes AcquireWait callers (NOTIFY on
// NotifyChannel, sent when the statement commits, only when one is
// registered as waiting for the lease). Releasing a lease
// that has already expired or been released with the same token is not an
// error: the call is safe to retry. The lease row is kept, expired, with
// its last holder and token.
//
// Errors: *quota.InputError for a bad name or token; ErrLost when the lease
// has been taken over since (the successor's lease is left as it is) or
// never existed; quota.ErrSchemaMissing; database errors.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call (releasing again with the
// token is harmless).
func (c *Client) Release(ctx context.Context, l Lease) (_ Lease, err error) {
	defer c.core.M.LeaseDone(ctx, core.OpRelease, c.core.M.Now(), &err)
	return c.release(ctx, c.core.DB, l.Name, l.Token)
}

// ReleaseTx is Release inside the caller's transaction: the lease is free
// to others once tx commits.
func (c *Client) ReleaseTx(ctx context.Context, tx pgx.Tx, l Lease) (_ Lease, err error) {
	defer c.core.M.LeaseDone(ctx, core.OpRelease, c.core.M.Now(), &err)
	return c.release(ctx, tx, l.Name, l.Token)
}

func (c *Client) release(ctx context.Context, x db.DBTX, name string, token int64) (Lease, error) {
	if err := core.CheckName("lease name", name); err != nil {
		return Lease{}, err
	}
	if err := checkToken(token); err != nil {
		return Lease{}, err
	}
	sent := time.Now()
	r, err := c.core.Queries.LeaseRelease(ctx, x, db.LeaseReleaseParams{Name: name, Token: token})
	if core.IsNoRows(err) {
		return Lease{}, c.leaseLost(ctx, x, "release", name, token)
	}
	if err != nil {
		return Lease{}, core.DBError("release lease", err)
	}
	return leaseFrom(db.PgquotaLease{
		Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
	}, r.DbNow, sent), nil
}

// Get returns the lease name as the database has it now, held or not
// (Lease.Held, judged by the database clock), with its payload.
//
// Errors: *quota.InputError for a bad name; ErrNotFound when it was never
// acquired; quota.ErrSchemaMissing; database errors.
func (c *Client) Get(ctx context.Context, name string) (Lease, error) {
	if err := core.CheckName("lease name", name); err != nil {
		return Lease{}, err
	}
	sent := time.Now()
	r, err := c.core.Queries.LeaseRead(ctx, c.core.DB.Reads(), name)
	if core.IsNoRows(err) {
		return Lease{}, core.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return Lease{}, core.DBError("get lease", err)
	}
	l := leaseFrom(db.PgquotaLease{
		Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
	}, r.DbNow, sent)
	l.Payload = r.Payload
	return l, nil
}

// WaitOptions tunes AcquireWait. The zero value (or nil) is ready to use.
type WaitOptions struct {
	// MinInterval is the first pause between attempts; pauses then double,
	// with ±50% jitter, up to MaxInterval. A pause never outlasts the
	// holder's remaining TTL as the database reported it, so a lease that
	// expires is taken promptly. Defaults to 10ms.
	MinInterval time.Duration
	// MaxInterval bounds the pause between attempts. Defaults to 1s, or
	// 100ms when nothing wakes a waiter early (NoListen, or the Client's
	// quota.Config.Pooler is quota.PoolerTransaction), so that a release is noticed
	// within about that long.
	MaxInterval time.Duration
	// NoListen turns off the early wake-up on release, which LISTENs on
	// NotifyChannel on a connection of its own, opened with the pool's
	// connection settings but outside the pool (so it never takes a
	// connection the attempts need), shared by all the Client's waiting
	// AcquireWait calls and kept open while any waits. Waiting then relies
	// on polling alone. A Client whose quota.Config.Pooler is quota.PoolerTransaction
	// never listens, whatever NoListen says: behind a transaction pooler
	// LISTEN stays on a server connection that other clients use next.
	// Defaults to false.
	NoListen bool
}

// AcquireWait acquires the lease like Acquire, waiting while another holder
// has it, until it is acquired or ctx ends. It polls with bounded
// exponential backoff and jitter, sleeping no longer than the holder's
// remaining TTL, and (unless opts.NoListen, or the Client's quota.Config.Pooler
// is quota.PoolerTransaction) wakes early when a release is announced on
// NotifyChannel. Notifications are only a hint: every
// decision is the acquire statement's, so a lost or spurious notification
// costs time, never safety. All attempts share one req.Attempt, so an
// attempt whose reply was lost is picked up by the next one.
//
// Errors not reported by the server (a broken connection, a lost reply:
// quota.ErrOutcomeUnknown) are retried too, up to 5 in a row. That is not a
// blind retry: every attempt has the same req.Attempt, so an attempt that
// took the lease without its reply arriving is returned by the next. When
// ctx ends after such an error, the error still wraps quota.ErrOutcomeUnknown:
// read the lease (Get) to learn whether req.Attempt holds it.
//
// Errors: those of Acquire except ErrHeld; when ctx ends first, an
// error wrapping both ctx's cause and the last *HeldError or error.
func (c *Client) AcquireWait(ctx context.Context, req AcquireRequest, opts *WaitOptions) (_ Lease, err error) {
	defer c.core.M.LeaseDone(ctx, core.OpAcquireWait, c.core.M.Now(), &err)
	if err := checkAcquire(&req); err != nil {
		return Lease{}, err
	}
	var o WaitOptions
	if opts != nil {
		o = *opts
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 10 * time.Millisecond
	}
	if c.pooler == quota.PoolerTransaction {
		o.NoListen = true
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = time.Second
		if o.NoListen {
			o.MaxInterval = pollerMaxInterval
		}
	}
	o.MaxInterval = max(o.MaxInterval, o.MinInterval)

	// The listener starts after the first attempt, and only when the lease
	// is held: a free lease costs no LISTEN connection. Once it listens,
	// the next attempt runs at once, so that a release committed before
	// LISTEN was in place is not missed.
	var notified func() <-chan struct{}
	unsubscribe := func() {}
	defer func() { unsubscribe() }()
	// Once listening, the waiter registers before each attempt, so that a
	// release notifies (lease_wait.go).
	waiter := &leaseWaiter{c: c, name: req.Name, waiter: req.Attempt}
	defer waiter.unregister(ctx)

	interval := o.MinInterval
	var lastHeld error
	failures := 0
	for {
		// Take the wake-up channel before the attempt, so that a release
		// committed after the attempt's snapshot is not missed.
		var wakeup <-chan struct{}
		if notified != nil {
			wakeup = notified()
			waiter.register(ctx)
		}
		l, err := core.Retry(ctx, c.core.Policy, func() (Lease, error) { return c.acquire(ctx, c.core.DB.Pool, req) })
		var held *HeldError
		pause := jitter(interval)
		switch {
		case err == nil:
			return l, nil
		case ctx.Err() != nil:
			if errors.Is(err, ErrHeld) {
				lastHeld = nil
			}
			return Lease{}, core.Errorf("pgquota: acquire lease %q: %w", req.Name, errors.Join(context.Cause(ctx), lastHeld, err))
		case errors.As(err, &held):
			lastHeld = err
			failures = 0
			if held.Remaining > 0 && held.Remaining < pause {
				pause = held.Remaining
			}
			if waiter.failed {
				// Not registered: a release may not notify.
				pause = min(pause, pollerMaxInterval)
			}
			if !o.NoListen && notified == nil {
				notified, unsubscribe = c.notifier.subscribe(ctx, c.core.Pool, req.Name)
				continue
			}
		case isTransient(err) && failures < maxTransientFailures:
			// A broken connection or a lost reply: the next attempt, with
			// the same attempt id, returns the lease if this one took it.
			failures++
		default:
			return Lease{}, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-wakeup:
		}
		t.Stop()
		if ctx.Err() != nil {
			return Lease{}, core.Errorf("pgquota: acquire lease %q: %w", req.Name, errors.Join(context.Cause(ctx), lastHeld))
		}
		interval = min(2*interval, o.MaxInterval)
	}
}

// maxTransientFailures bounds how many transient errors in a row
// AcquireWait absorbs.
const maxTransientFailures = 5

// isTransient reports errors worth another attempt: those that did not come
// from the server (a broken connection, a timeout, a lost reply), and those
// whose outcome is unknown (quota.ErrOutcomeUnknown, a FATAL error included), as
// opposed to an error the server reported for the statement or bad input.
// Its callers only retry statements that are safe to repeat (an acquire
// with the same attempt, a renew).
func isTransient(err error) bool {
	if errors.Is(err, quota.ErrOutcomeUnknown) {
		return true
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !errors.Is(err, core.ErrInvalidInput) && !errors.Is(err, core.ErrSchemaMissing)
}

// jitter returns d scaled by a random factor in [0.5, 1.5).
func jitter(d time.Duration) time.Duration {
	var b [8]byte
	_, _ = rand.Read(b[:])
	f := float64(uint64(b[0])|uint64(b[1])<<8|uint64(b[2])<<16) / float64(1<<24)
	return time.Duration(float64(d) * (0.5 + f))
}

// notifier shares one LISTENing connection among a Client's
// AcquireWait calls: it runs while at least one waits, and wakes the
// waiters of a lease when its release is announced. It is only a hint, so
// every failure here falls back to polling.
type notifier struct {
	mu      sync.Mutex
	refs    int
	waiters map[string]chan struct{} // closed when the lease's release is announced
	stop    context.CancelFunc
	done    chan struct{}
	ready   chan struct{} // closed once LISTEN is in place, or failed
}

// subscribe registers a waiter for lease name. notified returns a channel
// that is closed when a release of the lease is announced after the call
// (take it before each attempt); unsubscribe must be called when the wait
// ends. The first subscriber starts the listener and waits, bounded by ctx,
// until it listens.
func (n *notifier) subscribe(ctx context.Context, pool *pgxpool.Pool, name string) (notified func() <-chan struct{}, unsubscribe func()) {
	n.mu.Lock()
	n.refs++
	if n.refs == 1 {
		lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		n.stop, n.done, n.ready = stop, make(chan struct{}), make(chan struct{})
		n.waiters = map[string]chan struct{}{}
		go n.run(lctx, pool, n.done, n.ready)
	}
	ready := n.ready
	n.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
	}
	notified = func() <-chan struct{} {
		n.mu.Lock()
		defer n.mu.Unlock()
		ch, ok := n.waiters[name]
		if !ok {
			ch = make(chan struct{})
			n.waiters[name] = ch
		}
		return ch
	}
	unsubscribe = func() {
		n.mu.Lock()
		n.refs--
		if n.refs > 0 {
			n.mu.Unlock()
			return
		}
		stop, done := n.stop, n.done
		n.mu.Unlock()
		stop()
		<-done
	}
	return notified, unsubscribe
}

func (n *notifier) run(ctx context.Context, pool *pgxpool.Pool, done, ready chan struct{}) {
	defer close(done)
	readyOnce := sync.OnceFunc(func() { close(ready) })
	defer readyOnce()
	// A connection of its own, not one of the pool's: held for the whole
	// wait, a pooled one would be missing to the attempts, which starve
	// when the application holds the pool's other connections.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return
	}
	readyOnce()
	for {
		nt, err := conn.WaitForNotification(ctx)
		if err != nil {
			// ctx ended (the last waiter left), or the connection broke:
			// the waiters poll from here on.
			return
		}
		n.mu.Lock()
		if ch, ok := n.waiters[nt.Payload]; ok {
			close(ch)
			delete(n.waiters, nt.Payload)
		}
		n.mu.Unlock()
	}
}
