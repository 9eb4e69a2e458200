package lab

// redlock: WHAT NOT TO DO without fencing (as broken.go); redlock-fenced:
// the same lock with pgquota's fenced writes behind it, which holds.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

const (
	// redlockInstances is how many redis-server processes Redlock runs
	// on; the quorum is 3.
	redlockInstances = 5
	// redlockExpiry is the Redlock keys' time to live. The failure shown
	// needs no expiry at all (an instance forgets the lock on restart), so
	// it is long enough that request 1 is well inside its validity when it
	// writes: the lab's --ttl is for the naive locks.
	redlockExpiry = 10 * time.Second
	// redlockMargin is how long before the end of its validity request 1
	// stops waiting and writes. Request 1 works on after the restarted
	// instance answers again (a slow call, or a GC pause) until another
	// request holds the lock too and has read the counter, or until its
	// validity is that close to ending (plus the think time).
	redlockMargin = 500 * time.Millisecond
	// redlockRetryMin and redlockRetryMax bound the random delay before a
	// request tries the lock again: go-redsync's default. (Retrying much
	// faster, 19 requests split the votes of instances 3, 4 and 5 between
	// them again and again on a loaded machine, and none gets a quorum.)
	redlockRetryMin = 50 * time.Millisecond
	redlockRetryMax = 250 * time.Millisecond
	// redlockRestarted is the instance that restarts (index 2: instance 3),
	// and redlockCut the instances request 1 cannot reach (4 and 5).
	redlockRestarted = 2
	// redlockFencedResource is redlock-fenced's fenced resource: its
	// counter (key "counter") and each holder's presentation of its token
	// (key "holder").
	redlockFencedResource = "lab-redlock-fenced"
	// redlockTokenLease prefixes the pgquota leases that redlock-fenced
	// takes only for their tokens, one per Redlock acquisition.
	redlockTokenLease = "lab-redlock-token "
)

var redlockCut = []int{3, 4}

// redlock is Redlock (go-redsync/redsync over go-redis) on five
// redis-server processes that the lab starts, with one of the failures of
// Kleppmann's "How to do distributed locking" (2016) made to happen for
// real in every run:
//
//  1. Request 1 locks first. Its connections go through a TCP proxy per
//     instance, and the proxies to instances 4 and 5 reset every
//     connection: a partition, after which it reaches instances 1 to 3
//     only, still a quorum. It gets the lock on 1, 2 and 3.
//  2. Instance 3 is killed by its process id (SIGKILL) and started again
//     on the same port without persistence: it has forgotten the lock.
//  3. The other requests, which reach all five instances, now find 3, 4
//     and 5 free: one of them forms a quorum and holds the lock too, while
//     request 1, working on (until then, at most redlockMargin before its validity ends) inside the validity
//     Redlock promised it, still believes it holds the lock.
//
// Each holder then reads the counter, thinks, checks Redlock's validity
// (Mutex.Until, the client-side rule of the algorithm) and writes read+1.
// Without fencing (redlock) both writes land: a leaked grant, and the two
// believed-held spans overlap (RunResult.TwoHolders). With fencing
// (redlock-fenced) each holder, once it holds the Redlock, takes a pgquota
// fencing token (Redlock has none: a pgquota lease on a name of its own,
// taken only for its token, which is larger than every token issued
// before, for any lease) and presents it with a fenced write before
// reading, then writes the counter fenced by the same token: the storage
// admits only the highest token seen, so the first holder's write is
// rejected as stale, and it starts over. The lab's pauses are not
// injected here: the partition and the restart are the failure shown.
type redlock struct {
	fenced bool
	// noRestart leaves the partition alone, without the restart: the
	// control experiment of the tests, in which Redlock holds.
	noRestart bool

	dir     string
	srvs    []*redisServer
	direct  []*redis.Client // the other requests' paths, and Reset's
	proxies []*tcpProxy     // request 1's paths
	via     []*redis.Client // request 1's clients, through proxies
	rsOther *redsync.Redsync
	rsFirst *redsync.Redsync

	run *redlockRun
}

// redlockRun is one run's state.
type redlockRun struct {
	// tried is closed when request 1 has made its first attempt at the
	// lock: the others start then, so that request 1 locks first.
	tried     chan struct{}
	triedOnce sync.Once
	// injected is set once the restart was injected.
	injected bool
	// second is closed when a request other than request 1 holds the lock
	// and has read the counter.
	second     chan struct{}
	secondOnce sync.Once
}

func (s *redlock) Name() string {
	if s.fenced {
		return "redlock-fenced"
	}
	return "redlock"
}

func (s *redlock) Safe() bool { return s.fenced }

func (s *redlock) Injected(cfg Config) string {
	str := fmt.Sprintf("Redlock (go-redsync v4, go-redis v9) on %d redis-server processes started for the lab, "+
		"no persistence, expiry %s, quorum 3; injected (Kleppmann 2016): request 1 locks first through TCP proxies, "+
		"those to instances 4 and 5 resetting every connection (a partition: it reaches 1-3 only); once it holds the lock, "+
		"instance 3 is killed by pid (SIGKILL) and started again on its port, forgetting the lock; request 1 works on until another "+
		"request holds the lock too (at most until %s before its validity ends); the others reach all 5 and retry after a random 50-250ms; each holder: ",
		redlockInstances, redlockExpiry, redlockMargin)
	if s.fenced {
		return str + fmt.Sprintf("take a pgquota token (a lease of its own), present it with a fenced write, read, think %s, "+
			"check Redlock's validity, write read+1 fenced by the token, start over when rejected", cfg.Think)
	}
	return str + fmt.Sprintf("read, think %s, check Redlock's validity, write read+1 with no token", cfg.Think)
}

func (s *redlock) key() string { return "pgquota:lab:" + s.Name() + ":lock" }

func (s *redlock) Prepare(ctx context.Context, env *Env) (err error) {
	quietRedis.Do(func() { redis.SetLogger(voidLogger{}) })
	if err := createLabSchema(ctx, env); err != nil {
		return err
	}
	if s.dir, err = os.MkdirTemp("", "pgquota-lab-"+s.Name()+"-"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = s.Close(context.WithoutCancel(ctx), env)
		}
	}()
	var otherPools, firstPools []redsyncredis.Pool
	for i := range redlockInstances {
		srv, err := startRedis(ctx, env.Config.RedisServer, s.dir, "redis-"+strconv.Itoa(i+1))
		if err != nil {
			return fmt.Errorf("%w: instance %d of %d: %v", ErrUnavailable, i+1, redlockInstances, err)
		}
		s.srvs = append(s.srvs, srv)
		p, err := newTCPProxy(srv.Addr())
		if err != nil {
			return err
		}
		s.proxies = append(s.proxies, p)
		d := redisClient(srv.Addr(), env.Config.Requests+2)
		v := redisClient(p.Addr(), 2)
		s.direct, s.via = append(s.direct, d), append(s.via, v)
		otherPools, firstPools = append(otherPools, goredis.NewPool(d)), append(firstPools, goredis.NewPool(v))
	}
	for _, i := range redlockCut {
		s.proxies[i].SetCut(true)
	}
	s.rsOther, s.rsFirst = redsync.New(otherPools...), redsync.New(firstPools...)
	return nil
}

func redisClient(addr string, pool int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, PoolSize: pool, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
}

func (s *redlock) Reset(ctx context.Context, env *Env) error {
	for i, d := range s.direct {
		// A connection the last run's restart broke fails once.
		err := d.FlushAll(ctx).Err()
		if err != nil {
			err = d.FlushAll(ctx).Err()
		}
		if err != nil {
			return fmt.Errorf("flush instance %d: %w", i+1, err)
		}
	}
	s.run = &redlockRun{tried: make(chan struct{}), second: make(chan struct{})}
	if !s.fenced {
		return resetCounter(ctx, env, s.Name())
	}
	// The resource's highest token seen is kept: tokens only ever grow.
	_, err := env.DB.Exec(ctx, `DELETE FROM pgquota.fenced_row WHERE resource = $1`, redlockFencedResource)
	if err == nil {
		_, err = env.DB.Exec(ctx, `DELETE FROM pgquota.lease WHERE starts_with(name, $1)`, redlockTokenLease)
	}
	return err
}

func (s *redlock) Counter(ctx context.Context, env *Env) (int64, error) {
	if s.fenced {
		return readFencedKey(ctx, env.Fences, redlockFencedResource, "counter")
	}
	return readCounter(ctx, env.DB, s.Name())
}

func (s *redlock) Close(context.Context, *Env) error {
	for _, c := range append(s.direct, s.via...) {
		_ = c.Close()
	}
	for _, p := range s.proxies {
		p.Close()
	}
	for _, srv := range s.srvs {
		srv.kill()
	}
	s.direct, s.via, s.proxies, s.srvs = nil, nil, nil, nil
	if s.dir == "" {
		return nil
	}
	err := os.RemoveAll(s.dir)
	s.dir = ""
	return err
}

// readFencedKey reads a fenced counter: 0 before its first write.
func readFencedKey(ctx context.Context, qc *fence.Client, resource, key string) (int64, error) {
	row, err := qc.Row(ctx, resource, key)
	if errors.Is(err, fence.ErrRowNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(row.Value, 10, 64)
}

func (s *redlock) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	run := s.run
	first := c.ID == 1
	rs := s.rsOther
	if first {
		rs = s.rsFirst
		defer run.triedOnce.Do(func() { close(run.tried) })
	} else {
		select {
		case <-run.tried:
		case <-ctx.Done():
			return Outcome{}, ctx.Err()
		}
	}
	deadline := giveUpAt(env.Config).Add(2 * redlockExpiry)
	var out Outcome
	for pass := 1; ; pass++ {
		m := rs.NewMutex(s.key(), redsync.WithExpiry(redlockExpiry), redsync.WithTries(1))
		for {
			err := m.TryLockContext(ctx)
			if first {
				run.triedOnce.Do(func() { close(run.tried) })
			}
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if time.Now().After(deadline) {
				return out, nil // gave up: denied
			}
			sleep(ctx, redlockRetryMin+time.Duration(rand.Int64N(int64(redlockRetryMax-redlockRetryMin))))
		}
		hold := Hold{From: time.Now()}
		granted, stale, err := s.critical(ctx, env, c, m, pass, first, &out)
		hold.Until = time.Now()
		if u := m.Until(); u.Before(hold.Until) {
			hold.Until = u
		}
		out.Holds = append(out.Holds, hold)
		// Unlock reports false when it reached no quorum (request 1 after
		// the restart): what it could delete is deleted, and the rest
		// expires.
		_, _ = m.UnlockContext(context.WithoutCancel(ctx))
		if stale && err == nil {
			out.StaleRejected = true
			if time.Now().After(deadline) {
				return out, nil // gave up: denied
			}
			continue // fenced off: start over with a new lock and token
		}
		out.Granted = granted
		return out, err
	}
}

// critical is one holder's critical section. It reports whether its write
// landed, and whether the storage rejected a token as stale.
func (s *redlock) critical(ctx context.Context, env *Env, c *Client, m *redsync.Mutex, pass int, first bool, out *Outcome) (granted, stale bool, err error) {
	cfg := env.Config
	owner := fmt.Sprintf("run%d-request%d-pass%d", env.Run, c.ID, pass)
	var token int64
	if s.fenced {
		l, err := c.Leases.Acquire(ctx, lease.AcquireRequest{Name: redlockTokenLease + owner, Holder: owner, TTL: time.Minute})
		if err != nil {
			return false, false, fmt.Errorf("take a pgquota token: %w", err)
		}
		token = l.Token
		defer func() {
			_, rerr := c.Leases.Release(context.WithoutCancel(ctx), l)
			if err == nil && rerr != nil && !errors.Is(rerr, lease.ErrLost) {
				err = rerr
			}
		}()
		// Present the token before reading: from now on no lower token
		// writes, so the value read stays the newest unless a higher
		// token comes, whose holder then reads after this one's write or
		// fences this one off.
		_, err = c.Fences.WriteRow(ctx, fence.WriteRowRequest{Resource: redlockFencedResource, Key: "holder", Value: owner, Token: token})
		if errors.Is(err, fence.ErrStaleToken) {
			return false, true, nil
		}
		if err != nil {
			return false, false, err
		}
	}
	var v int64
	if s.fenced {
		v, err = readFencedKey(ctx, c.Fences, redlockFencedResource, "counter")
	} else {
		v, err = readCounter(ctx, c.Pool, s.Name())
	}
	if err != nil || v >= cfg.Limit {
		return false, false, err
	}
	if !first {
		s.run.secondOnce.Do(func() { close(s.run.second) })
	}
	if first && !s.run.injected {
		s.run.injected = true
		if s.noRestart {
			out.Fault = "request 1 got the lock on instances 1-3 (its proxies to 4 and 5 reset every connection); no restart"
		} else if out.Fault, err = s.restartInstance(ctx); err != nil {
			return false, false, err
		}
		t := time.NewTimer(max(0, time.Until(m.Until())-cfg.Think-redlockMargin))
		select {
		case <-s.run.second:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	sleep(ctx, cfg.Think)
	if !time.Now().Before(m.Until()) {
		return false, false, nil // Redlock's validity ended: not ours any more
	}
	if !s.fenced {
		err = writeCounter(ctx, c.Pool, s.Name(), v+1)
		return err == nil, false, err
	}
	_, err = c.Fences.WriteRow(ctx, fence.WriteRowRequest{
		Resource: redlockFencedResource, Key: "counter", Value: strconv.FormatInt(v+1, 10), Token: token,
	})
	if errors.Is(err, fence.ErrStaleToken) {
		return false, true, nil
	}
	return err == nil, false, err
}

// restartInstance injects the restart, and says what was done.
func (s *redlock) restartInstance(ctx context.Context) (string, error) {
	srv := s.srvs[redlockRestarted]
	oldPID, newPID, down, err := srv.restart(ctx)
	if err != nil {
		return "", fmt.Errorf("restart instance %d: %w", redlockRestarted+1, err)
	}
	return fmt.Sprintf("request 1 got the lock on instances 1-3 (its proxies to 4 and 5 reset every connection); "+
		"instance 3 (port %d) was killed by pid %d (SIGKILL) and started again on its port as pid %d without persistence, "+
		"answering %s later with no keys; request 1 then worked on until another request held the lock too (at most until %s before its validity ended)", srv.port, oldPID, newPID,
		down.Round(time.Millisecond), redlockMargin), nil
}
