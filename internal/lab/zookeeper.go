package lab

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/pgquota/pgquota/internal/netpause"
	"github.com/pgquota/pgquota/internal/zkserver"
	"github.com/pgquota/pgquota/quota/fence"
)

// The ZooKeeper strategies take the lock recipe of ZooKeeper's manual
// ("Recipes and Solutions": each contender creates an ephemeral sequential
// node under the lock's node, the lowest sequence number holds the lock,
// the others watch their predecessor), in go-zookeeper's zk.Lock, on a
// standalone ZooKeeper server the lab starts for the run. A holder's lock
// lasts as long as its session: a holder whose connection goes silent for
// longer than the session timeout loses its node, and the next in line gets
// the lock. zookeeper writes read+1 with no token (WHAT NOT TO DO: the
// paused holder's stale write lands); zookeeper-fenced makes the holder's
// node's sequence number its fencing token, (1 << 32) + sequence (see
// fence.ExternalToken), and the storage refuses the stale write.

// zkTiming is the session timeout and the pause of the ZooKeeper
// strategies: the session timeout is the lab's TTL, at least 500ms (a JVM
// server on a busy machine), and a paused holder sleeps as many session
// timeouts as the lab's pause is TTLs, plus a tick (ZooKeeper expires
// sessions once a tick), so that the next holder has taken the lock and read
// the counter before the paused one wakes, plus 500ms for a busy machine
// (a session's last heartbeat may come late, and the next in line must
// connect again when its own session failed while it waited).
func zkTiming(cfg Config, tick time.Duration) (session, pause time.Duration) {
	session = max(cfg.TTL, 500*time.Millisecond)
	if cfg.Pause <= 0 || cfg.Paused == 0 {
		return session, 0
	}
	pause = time.Duration(float64(session) * float64(cfg.Pause) / float64(cfg.TTL))
	if cfg.Pause > cfg.TTL {
		pause += tick + 500*time.Millisecond
	}
	return session, pause
}

// zkHeldSeq returns the sequence number of the lock node conn's session
// holds under lockPath: the lowest child, which must be ephemeral and owned
// by this very session (after an expiry the lowest child is the next
// holder's).
func zkHeldSeq(conn *zk.Conn, lockPath string) (seq int64, node string, err error) {
	children, _, err := conn.Children(lockPath)
	if err != nil {
		return 0, "", err
	}
	type child struct {
		name string
		seq  int64
	}
	var cs []child
	for _, name := range children {
		i := strings.LastIndex(name, "lock-")
		if i < 0 {
			continue
		}
		s, err := strconv.ParseInt(name[i+len("lock-"):], 10, 64)
		if err != nil {
			continue
		}
		cs = append(cs, child{name, s})
	}
	if len(cs) == 0 {
		return 0, "", errLockLost
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].seq < cs[j].seq })
	node = lockPath + "/" + cs[0].name
	_, st, err := conn.Get(node)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, "", errLockLost
	}
	if err != nil {
		return 0, "", err
	}
	if st.EphemeralOwner != conn.SessionID() {
		return 0, "", errLockLost
	}
	return cs[0].seq, node, nil
}

// errLockLost: the lock service says the caller no longer holds the lock.
var errLockLost = errors.New("lock lost")

type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

type zookeeperLock struct {
	fenced bool

	srv      *zkserver.Server
	admin    *zk.Conn
	lockPath string
	// guard is what zookeeper-fenced writes to: a generic fenced row.
	resource string
}

func (s *zookeeperLock) Name() string {
	if s.fenced {
		return "zookeeper-fenced"
	}
	return "zookeeper"
}

func (s *zookeeperLock) Safe() bool { return s.fenced }

func (s *zookeeperLock) Injected(cfg Config) string {
	session, pause := zkTiming(cfg, 100*time.Millisecond)
	b := fmt.Sprintf("ZooKeeper lock recipe (ephemeral sequential nodes, zk.Lock), session timeout %s: lock, ", session)
	if s.fenced {
		b += "fence the resource with token (1<<32)+sequence number, "
	}
	b += fmt.Sprintf("read, think %s, check once the node is still ours", cfg.Think)
	if pause > 0 {
		b += fmt.Sprintf("; the first %d past the check pause %s with their ZooKeeper connection blackholed (no byte either way), so the server expires their session while they sleep", cfg.Paused, pause)
	}
	if s.fenced {
		return b + "; write read+1 fenced by the token (pgquota fence.Client.WriteRow, external token), start over when rejected"
	}
	return b + "; write read+1 with no token"
}

func (s *zookeeperLock) Prepare(ctx context.Context, env *Env) error {
	if err := createLabSchema(ctx, env); err != nil {
		return err
	}
	srv, err := zkserver.Start(ctx, zkserver.Options{})
	if err != nil {
		return fmt.Errorf("%w: ZooKeeper did not start: %s", ErrUnavailable, oneLine(err))
	}
	s.srv = srv
	s.admin, _, err = zk.Connect([]string{srv.Addr}, 5*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		srv.Stop()
		return err
	}
	if err := zkSession(ctx, s.admin); err != nil {
		return fmt.Errorf("%w: %s", ErrUnavailable, oneLine(err))
	}
	s.lockPath = "/pgquota-lab/" + s.Name()
	s.resource = "lab-" + s.Name()
	for _, p := range []string{"/pgquota-lab", s.lockPath, "/pgquota-lab/warm-up"} {
		if _, err := s.admin.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return s.warmUp(env.Config.Requests)
}

// zkSession waits until conn holds a session: zk.Connect connects in the
// background, and a request sent before its first attempt succeeds fails
// with zk.ErrNoServer when that attempt fails (a busy machine), though the
// client goes on trying.
func zkSession(ctx context.Context, conn *zk.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for conn.State() != zk.StateHasSession {
		select {
		case <-ctx.Done():
			return fmt.Errorf("zookeeper %s: no session after a minute (state %s)", conn.Server(), conn.State())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// warmUp runs the lock recipe once through n sessions at once on a lock of
// its own, so that the first run does not meet a cold JVM (its session
// expiries come late there).
func (s *zookeeperLock) warmUp(n int) error {
	errs := make(chan error, n)
	for range n {
		go func() {
			conn, _, err := zk.Connect([]string{s.srv.Addr}, 5*time.Second, zk.WithLogger(quietZK{}))
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			if err := zkSession(context.Background(), conn); err != nil {
				errs <- err
				return
			}
			l := zk.NewLock(conn, "/pgquota-lab/warm-up", zk.WorldACL(zk.PermAll))
			if err = l.Lock(); err == nil {
				err = l.Unlock()
			}
			errs <- err
		}()
	}
	var err error
	for range n {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return fmt.Errorf("zookeeper warm-up: %w", err)
	}
	return nil
}

func (s *zookeeperLock) Reset(ctx context.Context, env *Env) error {
	// The lock node stays: its children's sequence numbers keep growing
	// across runs, like the tokens.
	if s.fenced {
		_, err := env.DB.Exec(ctx, `DELETE FROM pgquota.fenced_row WHERE resource = $1`, s.resource)
		return err
	}
	return resetCounter(ctx, env, s.Name())
}

func (s *zookeeperLock) Counter(ctx context.Context, env *Env) (int64, error) {
	if s.fenced {
		return readFencedRow(ctx, env.Fences, s.resource)
	}
	return readCounter(ctx, env.DB, s.Name())
}

func (s *zookeeperLock) Close(context.Context, *Env) error {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.srv != nil {
		s.srv.Stop()
	}
	return nil
}

// readFencedRow reads the counter of a fenced resource: 0 before its first
// write.
func readFencedRow(ctx context.Context, qc *fence.Client, resource string) (int64, error) {
	row, err := qc.Row(ctx, resource, fencedKey)
	if errors.Is(err, fence.ErrRowNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(row.Value, 10, 64)
}

// coordGiveUp is when a request stops waiting for a lock service's lock:
// every holder keeps it at most a session timeout past its pause.
func coordGiveUp(cfg Config, ttl, pause time.Duration) time.Time {
	return time.Now().Add(time.Duration(cfg.Requests+2)*(ttl+cfg.Think+retryEvery) + 3*pause + 10*time.Second)
}

func (s *zookeeperLock) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	session, pause := zkTiming(env.Config, s.srv.TickTime)
	deadline := coordGiveUp(env.Config, session, pause)
	var out Outcome
	for first := true; ; first = false {
		granted, err := s.attempt(ctx, env, c, first, session, pause, deadline)
		switch {
		case s.fenced && (errors.Is(err, fence.ErrStaleToken)):
			out.StaleRejected = true
			continue
		case errors.Is(err, errGaveUp), errors.Is(err, errLockLost):
			return out, nil // denied
		case errors.Is(err, errLockService) && time.Now().Before(deadline) && ctx.Err() == nil:
			continue // the session failed before the lock was ours: try again in a new one
		}
		out.Granted = granted
		return out, err
	}
}

// errLockService marks a lock service's failure before the caller held
// the lock (its session expired while it waited, on a busy machine): the
// request starts over with a new session, as a real client would.
var errLockService = errors.New("lock service")

// attempt is one pass of the critical section in a ZooKeeper session of
// its own. It reports whether its write landed.
func (s *zookeeperLock) attempt(ctx context.Context, env *Env, c *Client, first bool, session, pause time.Duration, deadline time.Time) (bool, error) {
	cfg := env.Config
	hole := netpause.New()
	conn, _, err := zk.Connect([]string{s.srv.Addr}, session, zk.WithDialer(hole.ZKDial), zk.WithLogger(quietZK{}))
	if err != nil {
		return false, fmt.Errorf("%w: zookeeper connect: %w", errLockService, err)
	}
	defer conn.Close()
	// zk.Lock waits without a context: closing the connection ends the
	// wait.
	var gaveUp atomic.Bool
	stop := time.AfterFunc(time.Until(deadline), func() { gaveUp.Store(true); conn.Close() })
	defer context.AfterFunc(ctx, conn.Close)()
	lock := zk.NewLock(conn, s.lockPath, zk.WorldACL(zk.PermAll))
	err = lock.Lock()
	stop.Stop()
	if gaveUp.Load() {
		return false, errGaveUp
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, fmt.Errorf("%w: zookeeper lock: %w", errLockService, err)
	}
	defer func() { _ = lock.Unlock() }() // fails harmlessly once the session expired
	seq, node, err := zkHeldSeq(conn, s.lockPath)
	if errors.Is(err, errLockLost) {
		return false, fmt.Errorf("%w: zookeeper session lost as the lock was granted: %w", errLockService, err)
	}
	if err != nil {
		return false, fmt.Errorf("%w: zookeeper children: %w", errLockService, err)
	}
	var token int64
	if s.fenced {
		if token, err = fence.ExternalToken(1, seq, fence.ZooKeeperSeqBits); err != nil {
			return false, err
		}
		// Fence the resource with the token before reading: a holder
		// paused since it read is refused from now on.
		if _, err := c.Fences.WriteRow(ctx, fence.WriteRowRequest{
			Resource: s.resource, Key: "holder", Value: strconv.Itoa(c.ID), Token: token,
		}); err != nil {
			return false, err
		}
	}
	var v int64
	if s.fenced {
		v, err = readFencedRow(ctx, c.Fences, s.resource)
	} else {
		v, err = readCounter(ctx, c.Pool, s.Name())
	}
	if err != nil || v >= cfg.Limit {
		return false, err
	}
	sleep(ctx, cfg.Think)
	_, st, err := conn.Get(node)
	if err != nil || st.EphemeralOwner != conn.SessionID() {
		return false, errLockLost // denied, as the naive locks' failed check
	}
	if first {
		env.Faults.pauseHolder(ctx, pause, hole)
	}
	if !s.fenced {
		return true, writeCounter(ctx, c.Pool, s.Name(), v+1)
	}
	_, err = c.Fences.WriteRow(ctx, fence.WriteRowRequest{
		Resource: s.resource, Key: fencedKey, Value: strconv.FormatInt(v+1, 10), Token: token,
	})
	return err == nil, err
}
