package quota

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

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

// grantFenced grants quota like Grant, but the other way, so the two can
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
func (c *Client) grantFenced(ctx context.Context, req GrantRequest, ttl time.Duration) (res GrantResult, err error) {
	defer c.grantDone(ctx, core.OpGrantFenced, c.m.Now(), &req, &res, &err)
	// grantFenced reads one quota and no key: only those fields are checked.
	if _, err := checkGrantRequest(GrantRequest{Quota: req.Quota, Member: req.Member, Amount: req.Amount, Limit: req.Limit}, false); err != nil {
		return GrantResult{}, err
	}
	var limit pgtype.Int8
	if req.Limit != nil {
		limit = pgtype.Int8{Int64: *req.Limit, Valid: true}
	}
	if ttl == 0 {
		ttl = defaultFencedGrantTTL
	}
	if err := checkTTL(ttl); err != nil {
		return GrantResult{}, err
	}
	name := fencedGrantLease(req.Quota, req.Member)
	var lastErr error
	for range fencedGrantTries {
		res, err := c.grantFencedOnce(ctx, req, limit, name, ttl)
		if errors.Is(err, ErrStaleToken) || errors.Is(err, ErrLeaseLost) {
			lastErr = err
			continue
		}
		return res, err
	}
	return GrantResult{}, lastErr
}

// errCounterMoved is returned by a fenced grant's attempt whose counter was
// changed, between its read and its write, by a call that does not take the
// lease (Revoke, Grant, their Tx twins): nothing was written, and
// grantFenced starts over.
var errCounterMoved = errors.New("pgquota: fenced grant: the counter changed since it was read (a Revoke or Grant on the same counter): try again")

func (c *Client) grantFencedOnce(ctx context.Context, req GrantRequest, limit pgtype.Int8, name string, ttl time.Duration) (res GrantResult, err error) {
	l, err := c.AcquireWait(ctx, AcquireRequest{Name: name, Holder: "pgquota grant", TTL: ttl}, nil)
	if err != nil {
		return GrantResult{}, err
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
		if c.testHookFencedGrantRelease != nil {
			c.testHookFencedGrantRelease(ctx, l)
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = c.Release(rctx, l.Name, l.Token)
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
func (c *Client) grantFencedDecide(ctx context.Context, req GrantRequest, limit pgtype.Int8, l Lease) (res GrantResult, err error) {
	row, err := c.queries.UsageFencedRead(ctx, c.db.Reads(), db.UsageFencedReadParams{
		QuotaName: req.Quota, Member: req.Member, LimitValue: limit,
	})
	if isNoRows(err) {
		return GrantResult{}, core.Errorf("%w: %q", ErrQuotaNotFound, req.Quota)
	}
	if err != nil {
		return GrantResult{}, core.DBError("fenced grant: read", err)
	}
	if !row.HasLimit {
		return GrantResult{}, core.Errorf("%w (quota %q, member %q)", ErrNoLimit, req.Quota, req.Member)
	}
	res = GrantResult{
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

	if c.testHookFencedGrantPause != nil {
		c.testHookFencedGrantPause(ctx, l)
	}

	// The function computes the counter itself (the amount on the counter
	// read, within the limit, in the window the database clock is in):
	// the caller sends the request, not the new value.
	w, err := c.queries.UsageFencedWrite(ctx, c.db, db.UsageFencedWriteParams{
		QuotaName: req.Quota, Member: req.Member, Amount: req.Amount, LimitValue: limit,
		ReadUsed: row.Used, Lease: l.Name, Token: l.Token,
	})
	if isNoRows(err) {
		return GrantResult{}, errCounterMoved
	}
	if err != nil {
		return GrantResult{}, fenceDBError("fenced grant: write", err)
	}
	res.Granted = true
	res.Used = w.Used
	res.Remaining = max(row.LimitValue-w.Used, 0)
	res.WindowStart = core.TimeFromPG(w.WindowStart)
	res.WindowEnd = core.TimeFromPG(w.WindowEnd)
	return res, nil
}
