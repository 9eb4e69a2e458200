package lab

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

const (
	// fencedName is both the lease the fenced strategy takes and the
	// fenced resource its counter lives in, so a fenced write is checked
	// against that lease (fence.WriteRowRequest.Lease) and against the highest
	// token the resource has seen.
	fencedName = "lab-fenced"
	fencedKey  = "counter"
)

// fenced is the lock done right: the same critical section as the naive
// locks (lock, read, think, pause, write read+1), but the lock is a pgquota
// lease whose fencing token goes with the write, and the storage admits the
// write only while that lease is held with that token and no higher token
// has written (fence.Client.WriteRow with Lease set). A holder paused
// past its TTL wakes up to a rejected write instead of an overwrite; it
// then starts over with a new lease and reads the counter again, as
// fencedgrant.Granter.Grant (internal/fencedgrant, a comparison path) does, until it gets an answer or gives up
// waiting for the lease like the naive locks (denied). "Granted" means
// that the fenced write landed, so the decision behind it was made on a
// value read under the lease that wrote it.
//
// The steps are spelled out here rather than calling fencedgrant.Grant, so that
// the lab injects the very same think time and pause as the naive locks
// between the read and the write, and counts the rejected writes that
// fencedgrant.Grant retries silently.
type fenced struct{}

func (fenced) Name() string { return "fenced" }
func (fenced) Safe() bool   { return true }
func (fenced) Injected(cfg Config) string {
	s := fmt.Sprintf("pgquota lease, TTL %s: lease, read, think %s", cfg.TTL, cfg.Think)
	if cfg.Paused > 0 && cfg.Pause > 0 {
		s += fmt.Sprintf("; the first %d to reach the write pause %s", cfg.Paused, cfg.Pause)
		if cfg.Pause > cfg.TTL {
			s += " (> TTL, like a GC pause)"
		}
	}
	return s + "; write read+1 fenced by the lease's token, start over when rejected"
}

func (fenced) Prepare(context.Context, *Env) error { return nil }

func (fenced) Reset(ctx context.Context, env *Env) error {
	// The token sequence and the resource's highest token seen are kept:
	// tokens only ever grow, across runs too.
	_, err := env.DB.Exec(ctx, `DELETE FROM pgquota.fenced_row WHERE resource = $1`, fencedName)
	if err == nil {
		_, err = env.DB.Exec(ctx, `DELETE FROM pgquota.lease WHERE name = $1`, fencedName)
	}
	return err
}

func (fenced) Counter(ctx context.Context, env *Env) (int64, error) {
	return readFenced(ctx, env.Fences)
}

func (fenced) Close(context.Context, *Env) error { return nil }

// readFenced reads the counter: 0 before its first write.
func readFenced(ctx context.Context, qc *fence.Client) (int64, error) {
	row, err := qc.Row(ctx, fencedName, fencedKey)
	if errors.Is(err, fence.ErrRowNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(row.Value, 10, 64)
}

func (s fenced) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	// Give up waiting for the lease as the naive locks do.
	wctx, cancel := context.WithDeadline(ctx, giveUpAt(env.Config))
	defer cancel()
	holder := fmt.Sprintf("lab run %d request %d", env.Run, c.ID)
	var out Outcome
	for first := true; ; first = false {
		granted, err := s.attempt(ctx, wctx, env, c, holder, first)
		switch {
		case errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost):
			// Fenced off: the lease lapsed before the write. Nothing was
			// written; start over with a new lease.
			out.StaleRejected = true
			continue
		case errors.Is(err, errGaveUp):
			return out, nil // denied
		}
		out.Granted = granted
		return out, err
	}
}

var errGaveUp = errors.New("gave up waiting for the lease")

// attempt is one pass of the critical section under one lease. It reports
// whether its fenced write landed. Only a request's first pass may be
// paused, so the pauses hit as many requests as with the naive locks.
func (fenced) attempt(ctx, wctx context.Context, env *Env, c *Client, holder string, first bool) (granted bool, err error) {
	cfg := env.Config
	// AcquireWait with its default backoff, which never sleeps past the
	// holder's remaining TTL. (Polling at the naive locks' pace loads a
	// small machine enough to slow the holders' own statements.) Each
	// client's pool holds one connection, which leaves none for LISTEN.
	l, err := c.Leases.AcquireWait(wctx, lease.AcquireRequest{Name: fencedName, Holder: holder, TTL: cfg.TTL},
		&lease.WaitOptions{NoListen: true})
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return false, errGaveUp
		}
		return false, err
	}
	defer func() {
		// A lease that lapsed or was taken over needs no release.
		_, rerr := c.Leases.Release(context.WithoutCancel(ctx), l)
		if rerr != nil && !errors.Is(rerr, lease.ErrLost) && err == nil {
			err = rerr
		}
	}()
	v, err := readFenced(ctx, c.Fences)
	if err != nil || v >= cfg.Limit {
		return false, err
	}
	sleep(ctx, cfg.Think)
	if first {
		env.Faults.Pause(ctx) // the same GC pause as the naive locks get
	}
	_, err = c.Fences.WriteRow(ctx, fence.WriteRowRequest{
		Resource: fencedName, Key: fencedKey, Value: strconv.FormatInt(v+1, 10),
		Token: l.Token, Lease: l.Name,
	})
	return err == nil, err
}
