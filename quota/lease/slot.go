package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// Concurrency limits (semaphores): at most Limit holders of a semaphore at
// once, each holding one slot with its own fencing token and TTL, so a
// holder that crashed frees its slot when the TTL runs out. The peers are
// Consul's `consul lock -n` (a semaphore of N slots under a KV prefix) and
// Apache Curator's InterProcessSemaphoreV2 (acquire returns a lease,
// maxLeases is the limit); the names here follow theirs: a semaphore, its
// limit, the slots (Curator's leases) its holders hold.
//
// A slot is a lease. Slot i of semaphore S is the lease named
// SlotName(S, i) ("slot:S:i"), so everything a lease has, a slot has
// unchanged: the token comes from the same sequence as every lease token
// (strictly increasing, also across crashes and failovers); Renew, Release
// and Keepalive take Slot.Lease; a fenced write by a holder names the
// slot's lease (fence.WriteRowRequest.Lease, fence.PresentTokenRequest.Lease) and is
// refused once the slot expired or was taken over; List lists slots
// (prefix "slot:") and Reap deletes expired ones. What a lease row
// cannot do alone is count: pgquota.slot_acquire (migrations/00012_slots.sql)
// locks the semaphore's row, counts the held slots with a fresh snapshot
// and takes a free one, in one call, so the limit holds exactly under any
// concurrency, by the database clock alone. The other design weighed, a
// slot table of its own, would have needed its own copies of fencing, the
// guard's lease check, keepalive, listing and reaping.
//
// Fencing with a semaphore: the highest token seen is kept per resource,
// and holders of one semaphore hold different tokens at the same time, so
// two holders writing one resource would refuse each other. Each holder
// fences the resource of its own slot (Slot.Name, the default resource of
// the slot's lease), or resources of its own work items.

// Bounds of a semaphore.
const (
	// MaxSlotLimit is the largest SlotRequest.Limit accepted.
	MaxSlotLimit = 1000
	// MaxSemaphoreNameBytes is the longest semaphore name accepted, in
	// bytes of UTF-8 (a slot's lease name adds "slot:", ":" and the slot
	// number, within quota.MaxNameBytes).
	MaxSemaphoreNameBytes = core.MaxSemaphoreNameBytes
	// SlotPrefix starts the lease name of every slot. Leases with
	// names starting with it can be taken only by AcquireSlot: acquiring
	// one as a lease fails with SQLSTATE SQLStateSlotLease.
	SlotPrefix = "slot:"
	// SQLStateSlotLease is the SQLSTATE of an attempt to take a slot's
	// lease (a name starting with SlotPrefix) through the lease API.
	SQLStateSlotLease = "PQ012"
)

// ErrSemaphoreFull is returned by AcquireSlot and AcquireSlotTx when the
// semaphore's limit is reached, wrapped in a *SemaphoreFullError. (They are
// kept here, beside the calls, rather than in errors.go.)
var ErrSemaphoreFull = errors.New("pgquota: semaphore full: every slot is held")

// ErrSemaphoreNotFound is returned by Semaphore when no slot of the
// semaphore was ever acquired.
var ErrSemaphoreNotFound = errors.New("pgquota: semaphore not found")

// SlotName returns the lease name of slot (0-based) of semaphore name.
func SlotName(name string, slot int) string {
	return SlotPrefix + name + ":" + strconv.Itoa(slot)
}

// SlotRequest asks for a slot of a semaphore.
type SlotRequest struct {
	// Semaphore names the semaphore: 1 to MaxSemaphoreNameBytes bytes, no
	// control characters.
	Semaphore string
	// Limit is the most holders at once: 1 to MaxSlotLimit. The call is
	// admitted only while fewer than Limit slots are held, whatever limit
	// the holders were admitted under: lowering it lets no one in until
	// fewer than the new limit hold, and the holders above it keep their
	// slots (renewals work) until they release or expire. Callers of one
	// semaphore should state the same limit (as with Curator's maxLeases);
	// the last one stated is shown by Semaphore.
	Limit int
	// Holder names the process asking, as AcquireRequest.Holder. Defaults
	// to DefaultHolder() (host:pid) when empty.
	Holder string
	// TTL is how long the slot is held from the database clock's current
	// instant unless renewed: MinTTL to MaxTTL.
	TTL time.Duration
	// Attempt identifies this acquisition attempt, as
	// AcquireRequest.Attempt: calling again with the same Attempt while the
	// slot it took is held returns that slot. Empty means a fresh random
	// attempt per call.
	Attempt string
}

// Slot is a held slot of a semaphore: its lease (Renew, Release,
// Keepalive and fenced writes take Slot.Lease) and its place.
type Slot struct {
	Lease
	// Semaphore is the semaphore's name.
	Semaphore string `json:"semaphore"`
	// Index is the slot's number, 0 to the limit minus 1.
	Index int `json:"slot"`
	// Holders is the number of slots held after the acquire (AcquireSlot
	// only; 0 elsewhere).
	Holders int `json:"holders"`
}

// SemaphoreFullError is returned when a semaphore's limit is reached. It
// wraps ErrSemaphoreFull.
type SemaphoreFullError struct {
	// Semaphore is the semaphore's name.
	Semaphore string
	// Limit is the limit the call stated.
	Limit int
	// Holders is the number of slots held, by the database clock (above
	// Limit after the limit was lowered; below it when the only free slots
	// were locked by other sessions, which is rare and brief).
	Holders int
	// RetryAfter is when the first holder's slot expires unless renewed
	// (the earliest expiry minus the database clock), or 0 when unknown.
	// A release frees a slot sooner.
	RetryAfter time.Duration
}

func (e *SemaphoreFullError) Error() string {
	return fmt.Sprintf("pgquota: semaphore %q is full: %d held, limit %d (the first slot expires in %s unless renewed)",
		e.Semaphore, e.Holders, e.Limit, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap returns ErrSemaphoreFull.
func (e *SemaphoreFullError) Unwrap() error { return ErrSemaphoreFull }

func checkSemaphoreName(name string) error { return core.CheckSemaphoreName(name) }

func checkSlotRequest(req *SlotRequest) error {
	if err := checkSemaphoreName(req.Semaphore); err != nil {
		return err
	}
	if req.Limit < 1 || req.Limit > MaxSlotLimit {
		return core.Invalid("limit", "must be between 1 and %d, got %d", MaxSlotLimit, req.Limit)
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
	return core.CheckName("attempt", req.Attempt)
}

// AcquireSlot takes a slot of semaphore req.Semaphore for req.TTL when
// fewer than req.Limit slots are held by the database clock, in one call
// and one round trip, and returns it with a new fencing token (from the
// sequence of every lease token). Concurrent acquirers of one semaphore
// take turns on its row, so at most req.Limit hold at once, however many
// replicas call at once; a slot whose holder crashed or stalled past its
// TTL is taken over, with a larger token, and raises the fence of the
// slot's lease name, so the old holder's fenced writes are refused from
// then on. Repeating the call with the same req.Attempt while its slot is
// held returns that slot.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) naming the field for a bad
// semaphore name, limit, holder, TTL or attempt, nothing sent;
// *SemaphoreFullError (ErrSemaphoreFull) when the limit is reached;
// quota.ErrSchemaMissing; database errors; quota.ErrOutcomeUnknown when the reply was
// lost (repeat with the same req.Attempt, set with NewAttempt, to learn
// whether it took a slot). Nothing is written on any other error.
func (c *Client) AcquireSlot(ctx context.Context, req SlotRequest) (Slot, error) {
	if err := checkSlotRequest(&req); err != nil {
		return Slot{}, err
	}
	return core.Retry(ctx, c.core.Policy, func() (Slot, error) { return c.acquireSlot(ctx, c.core.DB.Pool, req) })
}

// AcquireSlotTx is AcquireSlot inside the caller's transaction: the slot
// is taken when tx commits, and other acquirers of the semaphore wait for
// tx meanwhile (keep it short). Under REPEATABLE READ or SERIALIZABLE a
// concurrent acquire makes it fail with SQLSTATE 40001, returned
// unchanged. Its TTL runs from the statement, not from the commit.
func (c *Client) AcquireSlotTx(ctx context.Context, tx pgx.Tx, req SlotRequest) (Slot, error) {
	if err := checkSlotRequest(&req); err != nil {
		return Slot{}, err
	}
	return c.acquireSlot(ctx, tx, req)
}

func (c *Client) acquireSlot(ctx context.Context, x db.DBTX, req SlotRequest) (Slot, error) {
	sent := time.Now()
	r, err := c.core.Queries.SlotAcquire(ctx, x, db.SlotAcquireParams{
		Name: req.Semaphore, SlotLimit: int32(req.Limit), Holder: req.Holder, Attempt: req.Attempt, Ttl: intervalOf(req.TTL),
	})
	if err != nil {
		return Slot{}, core.DBError("acquire slot", err)
	}
	if !r.Taken {
		e := &SemaphoreFullError{Semaphore: req.Semaphore, Limit: req.Limit, Holders: int(r.Holders)}
		if r.NextExpiry.Valid {
			e.RetryAfter = max(r.NextExpiry.Time.Sub(r.DbNow.Time), 0)
		}
		return Slot{}, e
	}
	l := leaseFrom(db.PgquotaLease{
		Name: r.LeaseName, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
	}, r.DbNow, sent)
	return Slot{Lease: l, Semaphore: req.Semaphore, Index: int(r.Slot), Holders: int(r.Holders)}, nil
}

// AcquireSlotWait is AcquireSlot, waiting while the semaphore is full until
// a slot is taken or ctx ends. It polls with bounded exponential backoff
// and jitter (opts.MinInterval, opts.MaxInterval; defaults 10ms and 250ms),
// sleeping no longer than the first holder's remaining TTL; it does not
// LISTEN (opts.NoListen is ignored), so it behaves the same behind a
// transaction pooler. All attempts share one req.Attempt, so an attempt
// whose reply was lost is picked up by the next, and errors not reported by
// the server are retried, up to 5 in a row.
//
// Errors: those of AcquireSlot except ErrSemaphoreFull; when ctx ends
// first, an error wrapping ctx's cause and the last *SemaphoreFullError
// (or the last error).
func (c *Client) AcquireSlotWait(ctx context.Context, req SlotRequest, opts *WaitOptions) (Slot, error) {
	if err := checkSlotRequest(&req); err != nil {
		return Slot{}, err
	}
	var o WaitOptions
	if opts != nil {
		o = *opts
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 10 * time.Millisecond
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = 250 * time.Millisecond
	}
	o.MaxInterval = max(o.MaxInterval, o.MinInterval)
	interval := o.MinInterval
	var last error
	failures := 0
	for {
		s, err := core.Retry(ctx, c.core.Policy, func() (Slot, error) { return c.acquireSlot(ctx, c.core.DB.Pool, req) })
		pause := jitter(interval)
		var full *SemaphoreFullError
		switch {
		case err == nil:
			return s, nil
		case ctx.Err() != nil:
			return Slot{}, core.Errorf("pgquota: acquire a slot of semaphore %q: %w", req.Semaphore, errors.Join(context.Cause(ctx), err))
		case errors.As(err, &full):
			last = err
			failures = 0
			if full.RetryAfter > 0 && full.RetryAfter < pause {
				pause = full.RetryAfter
			}
		case isTransient(err) && failures < maxTransientFailures:
			last = err
			failures++
		default:
			return Slot{}, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			return Slot{}, core.Errorf("pgquota: acquire a slot of semaphore %q: %w", req.Semaphore, errors.Join(context.Cause(ctx), last))
		}
		interval = min(2*interval, o.MaxInterval)
	}
}

// RenewSlot is Renew of the slot's lease (s.Name, s.Token): it extends the
// slot to ttl from the database clock while it is held with s.Token.
//
// Errors: those of Renew (ErrLost when the slot expired, was
// released or was taken over; quota.ErrOutcomeUnknown: repeat it).
func (c *Client) RenewSlot(ctx context.Context, s Slot, ttl time.Duration) (Slot, error) {
	l, err := c.Renew(ctx, s.Lease, ttl)
	if err != nil {
		return Slot{}, err
	}
	return Slot{Lease: l, Semaphore: s.Semaphore, Index: s.Index}, nil
}

// ReleaseSlot is Release of the slot's lease (s.Name, s.Token): the slot is
// free for the next AcquireSlot at once. Releasing again is harmless.
//
// Errors: those of Release (ErrLost when the slot was taken over
// since; quota.ErrOutcomeUnknown: repeat it).
func (c *Client) ReleaseSlot(ctx context.Context, s Slot) (Slot, error) {
	l, err := c.Release(ctx, s.Lease)
	if err != nil {
		return Slot{}, err
	}
	return Slot{Lease: l, Semaphore: s.Semaphore, Index: s.Index}, nil
}

// SemaphoreState is a semaphore as one statement read it.
type SemaphoreState struct {
	Name string `json:"name"`
	// Limit is the limit the last acquire stated.
	Limit int `json:"limit"`
	// Acquisitions counts the slots ever taken.
	Acquisitions int64 `json:"acquisitions"`
	// Held is the number of slots held at DBNow.
	Held int `json:"held"`
	// Slots are the slot rows, held or not (Slot.Held), by index; expired
	// and released ones stay until Reap deletes them.
	Slots []Slot `json:"slots"`
	// DBNow is the database clock's reading.
	DBNow time.Time `json:"db_now"`
}

// Holders returns the held slots.
func (s SemaphoreState) Holders() []Slot {
	var out []Slot
	for _, sl := range s.Slots {
		if sl.Held {
			out = append(out, sl)
		}
	}
	return out
}

// Semaphore returns semaphore name with its slots and holders, judged by
// the database clock.
//
// Errors: *quota.InputError for a bad name; ErrSemaphoreNotFound when no slot of
// it was ever acquired; quota.ErrSchemaMissing; database errors.
func (c *Client) Semaphore(ctx context.Context, name string) (SemaphoreState, error) {
	if err := checkSemaphoreName(name); err != nil {
		return SemaphoreState{}, err
	}
	sent := time.Now()
	sem, err := c.core.Queries.SemaphoreGet(ctx, c.core.DB.Reads(), name)
	if core.IsNoRows(err) {
		return SemaphoreState{}, core.Errorf("%w: %q", ErrSemaphoreNotFound, name)
	}
	if err != nil {
		return SemaphoreState{}, core.DBError("get semaphore", err)
	}
	rows, err := c.core.Queries.SlotList(ctx, c.core.DB.Reads(), name)
	if err != nil {
		return SemaphoreState{}, core.DBError("list slots", err)
	}
	st := SemaphoreState{Name: sem.Name, Limit: int(sem.SlotLimit), Acquisitions: sem.Acquisitions, DBNow: core.TimeFromPG(sem.DbNow), Slots: []Slot{}}
	for _, r := range rows {
		l := leaseFrom(db.PgquotaLease{
			Name: r.Name, Holder: r.Holder, Attempt: r.Attempt, Token: r.Token,
			AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt,
		}, r.DbNow, sent)
		l.Payload = r.Payload
		st.Slots = append(st.Slots, Slot{Lease: l, Semaphore: name, Index: int(r.Slot)})
		if l.Held {
			st.Held++
		}
		st.DBNow = l.DBNow
	}
	return st, nil
}

// SlotOf parses a slot's lease name (SlotName) into its semaphore and
// index; ok is false for other names.
func SlotOf(leaseName string) (semaphore string, index int, ok bool) {
	rest, found := strings.CutPrefix(leaseName, SlotPrefix)
	i := strings.LastIndexByte(rest, ':')
	if !found || i < 1 {
		return "", 0, false
	}
	n, err := strconv.Atoi(rest[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != rest[i+1:] {
		return "", 0, false
	}
	return rest[:i], n, true
}
