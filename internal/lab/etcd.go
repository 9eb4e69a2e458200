package lab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/pgquota/pgquota/internal/etcdserver"
	"github.com/pgquota/pgquota/internal/netpause"
	"github.com/pgquota/pgquota/quota/fence"
)

// The etcd strategies take etcd's own lock, concurrency.Mutex, on a session
// lease (concurrency.Session keeps it alive), on a single-member etcd
// server the lab starts for the run. The lock lasts as long as the lease: a
// holder whose connection goes silent for longer than the lease's TTL loses
// it (the server revokes the lease and deletes the lock key), and the next
// in line gets the lock. etcd writes read+1 with no token (WHAT NOT TO DO:
// the paused holder's stale write lands); etcd-fenced makes the lock key's
// create revision its fencing token, (1 << 40) + revision
// (fence.ExternalToken), presented to a lab table guarded by pgquota's fence
// guard for external tokens, and the storage refuses the stale write.

// etcdTiming is the lease TTL and pause of the etcd strategies: the TTL is
// the lab's, in whole seconds (etcd's unit), at least 1s, and a paused
// holder sleeps as many TTLs as the lab's pause is TTLs, plus 500ms (etcd
// revokes expired leases twice a second).
func etcdTiming(cfg Config) (ttl, pause time.Duration) {
	ttl = max(cfg.TTL.Round(time.Second), time.Second)
	if cfg.Pause <= 0 || cfg.Paused == 0 {
		return ttl, 0
	}
	pause = time.Duration(float64(ttl) * float64(cfg.Pause) / float64(cfg.TTL))
	if cfg.Pause > cfg.TTL {
		pause += 500 * time.Millisecond
	}
	return ttl, pause
}

// etcdTable is etcd-fenced's guarded table.
const etcdTable = "lab.etcd_counter"

type etcdLock struct {
	fenced bool

	srv      *etcdserver.Server
	prefix   string
	resource string
}

func (s *etcdLock) Name() string {
	if s.fenced {
		return "etcd-fenced"
	}
	return "etcd"
}

func (s *etcdLock) Safe() bool { return s.fenced }

func (s *etcdLock) Injected(cfg Config) string {
	ttl, pause := etcdTiming(cfg)
	b := fmt.Sprintf("etcd concurrency.Mutex on a session lease, TTL %s: lock, ", ttl)
	if s.fenced {
		b += "present token (1<<40)+create revision of the lock key to the guarded table, "
	}
	b += fmt.Sprintf("read, think %s, check once the key is still ours", cfg.Think)
	if pause > 0 {
		b += fmt.Sprintf("; the first %d past the check pause %s with their etcd connection blackholed (no byte either way), so the server revokes their lease while they sleep", cfg.Paused, pause)
	}
	if s.fenced {
		return b + "; write read+1 to a table under pgquota's fence guard (--external), start over when rejected"
	}
	return b + "; write read+1 with no token"
}

func (s *etcdLock) Prepare(ctx context.Context, env *Env) error {
	if err := createLabSchema(ctx, env); err != nil {
		return err
	}
	srv, err := etcdserver.Start(ctx, etcdserver.Options{})
	if err != nil {
		return fmt.Errorf("%w: etcd did not start: %s", ErrUnavailable, oneLine(err))
	}
	s.srv = srv
	s.prefix = "/pgquota-lab/" + s.Name()
	if s.fenced {
		if _, err := env.DB.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+etcdTable+` (
			id          int    PRIMARY KEY,
			value       bigint NOT NULL,
			fence_token bigint)`); err != nil {
			return err
		}
		g, err := env.Fences.GuardTable(ctx, fence.GuardTableRequest{Table: etcdTable, Column: "fence_token", External: true})
		if err != nil {
			return err
		}
		s.resource = g.Resource
	}
	return nil
}

func (s *etcdLock) Reset(ctx context.Context, env *Env) error {
	if !s.fenced {
		return resetCounter(ctx, env, s.Name())
	}
	// The guard admits this write too only with a token: the highest the
	// table has seen (an equal token is admitted), or 1 on a fresh table.
	return pgx.BeginFunc(ctx, env.DB, func(tx pgx.Tx) error {
		var mark int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(max_token), 1) FROM pgquota.fence WHERE resource = $1`, s.resource).Scan(&mark); err != nil {
			return err
		}
		if err := env.Fences.PresentTokenTx(ctx, tx, fence.PresentTokenRequest{Resource: s.resource, Token: mark}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+etcdTable+` (id, value) VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET value = 0`)
		return err
	})
}

func (s *etcdLock) Counter(ctx context.Context, env *Env) (int64, error) {
	if !s.fenced {
		return readCounter(ctx, env.DB, s.Name())
	}
	var v int64
	err := env.DB.QueryRow(ctx, `SELECT value FROM `+etcdTable+` WHERE id = 1`).Scan(&v)
	return v, err
}

func (s *etcdLock) Close(context.Context, *Env) error {
	if s.srv != nil {
		s.srv.Stop()
	}
	return nil
}

func (s *etcdLock) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	ttl, pause := etcdTiming(env.Config)
	deadline := coordGiveUp(env.Config, ttl, pause)
	var out Outcome
	for first := true; ; first = false {
		granted, err := s.attempt(ctx, env, c, first, ttl, pause, deadline)
		switch {
		case s.fenced && errors.Is(err, fence.ErrStaleToken):
			out.StaleRejected = true
			continue
		case errors.Is(err, errGaveUp), errors.Is(err, errLockLost):
			return out, nil // denied
		case errors.Is(err, errLockService) && time.Now().Before(deadline) && ctx.Err() == nil:
			continue // the lease failed before the lock was ours: try again with a new one
		}
		out.Granted = granted
		return out, err
	}
}

// attempt is one pass of the critical section with an etcd client, session
// and lease of its own. It reports whether its write landed.
func (s *etcdLock) attempt(ctx context.Context, env *Env, c *Client, first bool, ttl, pause time.Duration, deadline time.Time) (bool, error) {
	cfg := env.Config
	hole := netpause.New()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{s.srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(hole.Dial)},
	})
	if err != nil {
		return false, err
	}
	defer cli.Close()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("%w: etcd session: %w", errLockService, err)
	}
	defer func() { _ = sess.Close() }() // revokes the lease, if it still exists
	m := concurrency.NewMutex(sess, s.prefix)
	lctx, cancel := context.WithDeadline(ctx, deadline)
	err = m.Lock(lctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && lctx.Err() != nil {
			return false, errGaveUp
		}
		return false, fmt.Errorf("%w: etcd lock: %w", errLockService, err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = m.Unlock(uctx) // deletes nothing once the lease was revoked
	}()
	owned := func() (int64, error) {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := cli.Txn(octx).If(m.IsOwner()).Then(clientv3.OpGet(m.Key())).Commit()
		if err != nil {
			return 0, err
		}
		if !r.Succeeded || len(r.Responses[0].GetResponseRange().Kvs) == 0 {
			return 0, errLockLost
		}
		return r.Responses[0].GetResponseRange().Kvs[0].CreateRevision, nil
	}
	rev, err := owned()
	if err != nil {
		return false, fmt.Errorf("%w: etcd lock key lost as the lock was granted: %w", errLockService, err)
	}
	token, err := fence.ExternalToken(1, rev, fence.EtcdRevisionBits)
	if err != nil {
		return false, err
	}
	var v int64
	if s.fenced {
		// Present the token before reading: a holder paused since it read
		// is refused from now on.
		err = pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
			if err := c.Fences.PresentTokenTx(ctx, tx, fence.PresentTokenRequest{Resource: s.resource, Token: token}); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT value FROM `+etcdTable+` WHERE id = 1`).Scan(&v)
		})
	} else {
		v, err = readCounter(ctx, c.Pool, s.Name())
	}
	if err != nil || v >= cfg.Limit {
		return false, err
	}
	sleep(ctx, cfg.Think)
	if _, err := owned(); err != nil {
		return false, err // lost: denied, as the naive locks' failed check
	}
	if first {
		env.Faults.pauseHolder(ctx, pause, hole)
	}
	if !s.fenced {
		return true, writeCounter(ctx, c.Pool, s.Name(), v+1)
	}
	err = pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
		if err := c.Fences.PresentTokenTx(ctx, tx, fence.PresentTokenRequest{Resource: s.resource, Token: token}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+etcdTable+` SET value = $1 WHERE id = 1`, v+1)
		return fence.MapError(err)
	})
	return err == nil, err
}
