// Package fencedgrant is a comparison path, not part of pgquota's API: it
// grants quota the read-decide-write way, under a lease (package
// quota/lease) with a fenced write (package quota/fence's storage half),
// so that tests, the lab and the benchmarks can pit it against
// quota.Client.Grant, which does the same job in one round trip.
package fencedgrant

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/clientcore"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// Granter grants quota the fenced way (Grant) on a quota.Client's pool,
// with its settings. Set its hooks before the first Grant.
type Granter struct {
	core   *core.Core
	leases *lease.Client

	// Pause, when not nil, runs in Grant between the read and the fenced
	// write.
	Pause func(context.Context, lease.Lease)
	// BeforeRelease, when not nil, runs in Grant just before it releases
	// its lease.
	BeforeRelease func(context.Context, lease.Lease)
}

// New returns a Granter on c.
func New(c *quota.Client) (*Granter, error) {
	k, err := clientcore.Of(c)
	if err != nil {
		return nil, err
	}
	l, err := lease.New(c)
	if err != nil {
		return nil, err
	}
	return &Granter{core: k, leases: l}, nil
}

// Grant is grantFenced on c with a Granter of its own (no hooks).
func Grant(ctx context.Context, c *quota.Client, req quota.GrantRequest, ttl time.Duration) (quota.GrantResult, error) {
	g, err := New(c)
	if err != nil {
		return quota.GrantResult{}, err
	}
	return g.Grant(ctx, req, ttl)
}

// LeaseName is the name of the lease Grant takes for a quota and member.
func LeaseName(quota, member string) string { return fencedGrantLease(quota, member) }

// defaultFencedGrantTTL is the lease TTL grantFenced uses when given 0.
const defaultFencedGrantTTL = 10 * time.Second

// fencedGrantTries bounds how often grantFenced starts over after its
// write was fenced off (its lease lapsed during a pause).
const fencedGrantTries = 5

// fencedGrantLease returns the name of the lease grantFenced takes for a
// quota and member: "pgquota.grant:" and 32 hex digits of a SHA-256 of both
// names (a quota name and a member together may exceed a lease name's
// length).
func fencedGrantLease(quota, member string) string {
	h := sha256.Sum256([]byte(quota + "\x00" + member))
	return "pgquota.grant:" + hex.EncodeToString(h[:16])
}

// Grant grants quota like quota.Client.Grant, but the other way, so the two can
// be compared (tests and the fenced-write benchmark reach it through
// export_test.go; it is not part of the public API, since Grant does the
// same job in one round trip): the check and the write are separate statements made safe
// by a fenced lock instead of one conditional update. It
//
//  1. acquires the lease fencedGrantLease(req.Quota, req.Member) with
//     AcquireWait (TTL ttl, defaultFencedGrantTTL when 0), which polls
//     instead of LISTENing when Config.Pooler is PoolerTransaction;
//  2. reads the member's counter and limit (a plain read);
//  3. decides in Go whether req.Amount fits;
//  4. writes with a fenced write: one statement that admits the write only
//     while the lease is held with its token (the lease row locked FOR
//     SHARE) and the token is the highest seen for the lease's resource
//     (pgquota.fence_admit), and that computes the counter itself: it adds
//     req.Amount to the counter read, within the limit, in the window the
//     database clock is in (pgquota.usage_fenced_write), so that no caller
//     can set a counter to a value of its choosing;
//  5. releases the lease.
//
// The counter stays exact under any number of concurrent callers, also
// when a caller pauses between its read and its write for longer than the
// TTL: by then another caller may have taken the lease, and the paused
// caller's write is rejected (ErrStaleToken or ErrLeaseLost); grantFenced
// then starts over with a new lease, up to 5 times. The write also lands
// only while the counter still holds the value read, so that a Revoke or a
// Grant on the same counter, which take no lease, is never undone; the
// counter is then read again under the same lease, up to 50 times. A denial writes
// nothing and is a result, as with Grant. It costs at least four round
// trips, where Grant costs one.
//
// The lease is released before the call returns. When that release fails
// (the connection was lost, the backend terminated) after the outcome was
// decided, the call still returns the outcome, with a nil error: a
// committed grant always comes back as a success. The lease then expires
// on its own, ttl after it was taken, and until then other grantFenced
// calls for the same counter wait for it (AcquireWait).
//
// A fenced write whose reply was lost (ErrOutcomeUnknown) is not
// retried: it may have committed. grantFenced takes no idempotency key:
// read the counter (Usage) to learn the outcome.
//
// Errors: those of Grant; the errors of AcquireWait; *StaleTokenError or
// ErrLeaseLost when the write was fenced off 5 times in a row; an error
// saying the counter changed when it did 50 times in a row.
func (c *Granter) Grant(ctx context.Context, req quota.GrantRequest, ttl time.Duration) (res quota.GrantResult, err error) {
	defer c.grantDone(ctx, c.core.M.Now(), &req, &res, &err)
	if err := core.CheckName("quota name", req.Quota); err != nil {
		return quota.GrantResult{}, err
	}
	if err := core.CheckName("member", req.Member); err != nil {
		return quota.GrantResult{}, err
	}
	if err := core.CheckUnits("amount", req.Amount, 1); err != nil {
		return quota.GrantResult{}, err
	}
	var limit pgtype.Int8
	if req.Limit != nil {
		if err := core.CheckUnits("limit", *req.Limit, 0); err != nil {
			return quota.GrantResult{}, err
		}
		limit = pgtype.Int8{Int64: *req.Limit, Valid: true}
	}
	if ttl == 0 {
		ttl = defaultFencedGrantTTL
	}
	if err := core.CheckTTL(ttl); err != nil {
		return quota.GrantResult{}, err
	}
	name := fencedGrantLease(req.Quota, req.Member)
	var lastErr error
	for range fencedGrantTries {
		res, err := c.grantFencedOnce(ctx, req, limit, name, ttl)
		if errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost) {
			lastErr = err
			continue
		}
		return res, err
	}
	return quota.GrantResult{}, lastErr
}

// errCounterMoved is returned by a fenced grant's attempt whose counter was
// changed, between its read and its write, by a call that does not take the
// lease (Revoke, Grant, their Tx twins): nothing was written, and
// grantFenced starts over.
var errCounterMoved = errors.New("pgquota: fenced grant: the counter changed since it was read (a Revoke or Grant on the same counter): try again")

func (c *Granter) grantFencedOnce(ctx context.Context, req quota.GrantRequest, limit pgtype.Int8, name string, ttl time.Duration) (res quota.GrantResult, err error) {
	l, err := c.leases.AcquireWait(ctx, lease.AcquireRequest{Name: name, Holder: "pgquota grant", TTL: ttl}, nil)
	if err != nil {
		return quota.GrantResult{}, err
	}
	defer func() {
		// The release is a courtesy to the next caller, not part of the
		// outcome: once the fenced write committed (or the denial was
		// decided), that outcome is the call's, and a failed release (a
		// terminated backend, a lost connection) only leaves the lease to
		// expire on its own, ttl after it was taken. Returning the release
		// error instead would make a caller who checks the error first
		// grant again. A lease that lapsed or was taken over needs no
		// release either.
		if c.BeforeRelease != nil {
			c.BeforeRelease(ctx, l)
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = c.leases.Release(rctx, l)
	}()

	// A counter changed by a call that takes no lease is read again, under
	// the same lease, a bounded number of times.
	wait := time.Millisecond
	for try := 1; ; try++ {
		res, err = c.grantFencedDecide(ctx, req, limit, l)
		if !errors.Is(err, errCounterMoved) || try == maxCounterMoves {
			return res, err
		}
		t := time.NewTimer(jitter(wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, err
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// maxCounterMoves bounds how often a fenced grant reads the counter again
// under one lease after finding it changed by a call that takes no lease.
const maxCounterMoves = 50

// grantFencedDecide reads the counter, decides, and writes under lease l.
func (c *Granter) grantFencedDecide(ctx context.Context, req quota.GrantRequest, limit pgtype.Int8, l lease.Lease) (res quota.GrantResult, err error) {
	row, err := c.core.Queries.UsageFencedRead(ctx, c.core.DB.Reads(), db.UsageFencedReadParams{
		QuotaName: req.Quota, Member: req.Member, LimitValue: limit,
	})
	if core.IsNoRows(err) {
		return quota.GrantResult{}, core.Errorf("%w: %q", quota.ErrQuotaNotFound, req.Quota)
	}
	if err != nil {
		return quota.GrantResult{}, core.DBError("fenced grant: read", err)
	}
	if !row.HasLimit {
		return quota.GrantResult{}, core.Errorf("%w (quota %q, member %q)", quota.ErrNoLimit, req.Quota, req.Member)
	}
	res = quota.GrantResult{
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Used:        row.Used,
		Limit:       row.LimitValue,
		WindowStart: core.TimeFromPG(row.WindowStart),
		WindowEnd:   core.TimeFromPG(row.WindowEnd),
	}
	if row.Used+req.Amount > row.LimitValue {
		res.Remaining = max(row.LimitValue-row.Used, 0)
		return res, nil
	}

	if c.Pause != nil {
		c.Pause(ctx, l)
	}

	// The function computes the counter itself (the amount on the counter
	// read, within the limit, in the window the database clock is in):
	// the caller sends the request, not the new value.
	w, err := c.core.Queries.UsageFencedWrite(ctx, c.core.DB, db.UsageFencedWriteParams{
		QuotaName: req.Quota, Member: req.Member, Amount: req.Amount, LimitValue: limit,
		ReadUsed: row.Used, Lease: l.Name, Token: l.Token,
	})
	if core.IsNoRows(err) {
		return quota.GrantResult{}, errCounterMoved
	}
	if err != nil {
		return quota.GrantResult{}, fenceDBError("fenced grant: write", err)
	}
	res.Granted = true
	res.Used = w.Used
	res.Remaining = max(row.LimitValue-w.Used, 0)
	res.WindowStart = core.TimeFromPG(w.WindowStart)
	res.WindowEnd = core.TimeFromPG(w.WindowEnd)
	return res, nil
}

// grantDone records Grant's outcome, as quota.Client's grants do.
func (c *Granter) grantDone(ctx context.Context, start time.Time, req *quota.GrantRequest, res *quota.GrantResult, err *error) {
	m := c.core.M
	if m == nil {
		return
	}
	r := *res
	if m.QuotaNames() && r.Quota == "" {
		r.Quota = req.Quota
	}
	m.GrantOutcome(ctx, core.OpGrantFenced, r.Quota, r.Granted, r.Replayed, r.Amount, *err)
	m.End(ctx, core.OpGrantFenced, start, *err)
}

// jitter returns d scaled by a random factor in [0.5, 1.5).
func jitter(d time.Duration) time.Duration {
	var b [8]byte
	_, _ = rand.Read(b[:])
	f := float64(uint64(b[0])|uint64(b[1])<<8|uint64(b[2])<<16) / float64(1<<24)
	return time.Duration(float64(d) * (0.5 + f))
}

// fenceDBError is package fence's mapping of a fenced write's error.
func fenceDBError(op string, err error) error {
	if mapped := fence.MapError(err); mapped != err {
		return mapped
	}
	return core.DBError(op, err)
}
