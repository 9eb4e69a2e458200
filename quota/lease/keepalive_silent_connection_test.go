package lease_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// blackholeProxy is a TCP proxy between a test's pool and PostgreSQL that
// can make connections go silent, the way a network that drops packets
// does: a silenced connection stays open on both sides, and whatever is
// sent on it is read and thrown away, so neither side hears from the other
// again and nobody gets a reset.
type blackholeProxy struct {
	ln net.Listener
	// silenceNew makes connections accepted from now on silent too.
	silenceNew atomic.Bool

	mu    sync.Mutex
	links []*atomic.Bool // per connection: silenced
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln}
	var conns sync.WaitGroup
	var open sync.Mutex
	var all []net.Conn
	t.Cleanup(func() {
		ln.Close()
		open.Lock()
		for _, c := range all {
			c.Close()
		}
		open.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			open.Lock()
			all = append(all, client, server)
			open.Unlock()
			silenced := &atomic.Bool{}
			silenced.Store(p.silenceNew.Load())
			p.mu.Lock()
			p.links = append(p.links, silenced)
			p.mu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); pipe(server, client, silenced) }()
			go func() { defer conns.Done(); pipe(client, server, silenced) }()
		}
	}()
	return p
}

// pipe copies from src to dst until either fails, dropping what it reads
// while silenced is set.
func pipe(dst, src net.Conn, silenced *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !silenced.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// silenceExisting makes every connection open now go silent; new ones
// still go through.
func (p *blackholeProxy) silenceExisting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.links {
		s.Store(true)
	}
	return len(p.links)
}

// silenceAll makes every connection, open now or later, silent.
func (p *blackholeProxy) silenceAll() {
	p.silenceNew.Store(true)
	p.silenceExisting()
}

// proxied returns a client whose pool (maxConns connections) goes through
// a blackholeProxy, beside b's direct pool on the same database.
func proxied(t *testing.T, maxConns int32) (*testBundle, *quota.Client, *blackholeProxy) {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	direct := pgtest.Connect(t, dbURL, 4)
	client, err := quota.New(direct, nil)
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy := newBlackholeProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	pool := pgtest.Connect(t, u.String(), maxConns)
	viaProxy, err := quota.New(pool, nil)
	require.NoError(t, err)
	// Open every connection of the pool, so that all of them go silent.
	conns := make([]interface{ Release() }, 0, maxConns)
	for range maxConns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return &testBundle{ctx: context.Background(), pool: direct, client: client, operator: operatorOf(t, client), owner: pgtest.ConnectOwner(t, dbURL, 1), leases: leaseOf(t, client), fences: fenceOf(t, client)}, viaProxy, proxy
}

// When the connections the keeper renews on go silent (packets dropped, no
// reset) while new connections still work, each renewal attempt is given
// up well inside the window and retried on another connection: the work
// goes on, and the lease stays held.
func TestKeepaliveSurvivesSilentConnections(t *testing.T) {
	t.Parallel()
	b, viaProxy, proxy := proxied(t, 4)
	const ttl = 1500 * time.Millisecond
	l, err := leaseOf(t, viaProxy).Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "h", TTL: ttl})
	require.NoError(t, err)
	var log renewLog
	k, err := leaseOf(t, viaProxy).Keepalive(b.ctx, l, &lease.KeepaliveOptions{OnRenew: log.record})
	require.NoError(t, err)
	defer k.Stop()

	time.Sleep(ttl / 2)
	require.Equal(t, 4, proxy.silenceExisting(), "every pooled connection goes silent")
	okBefore, _ := log.counts()
	time.Sleep(3 * ttl)
	require.NoError(t, k.Context().Err(), "the work goes on: %v", context.Cause(k.Context()))
	okAfter, failed := log.counts()
	require.Greater(t, okAfter, okBefore+1, "renewals succeed on new connections")
	require.GreaterOrEqual(t, failed, 1, "an attempt on a silent connection failed")
	require.False(t, b.dbExpired(t, "job"))
}

// When nothing gets through any more, not even on new connections, the
// work context still ends before the lease expires by the database clock.
func TestKeepaliveEndsBeforeExpiryWhenNothingGetsThrough(t *testing.T) {
	t.Parallel()
	b, viaProxy, proxy := proxied(t, 2)
	const ttl = 1500 * time.Millisecond
	l, err := leaseOf(t, viaProxy).Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "h", TTL: ttl})
	require.NoError(t, err)
	k, err := leaseOf(t, viaProxy).Keepalive(b.ctx, l, nil)
	require.NoError(t, err)
	proxy.silenceAll()
	expired, cause := watchCancel(t, b, k, 3*ttl)
	require.False(t, expired, "cancelled before the database expiry")
	require.ErrorIs(t, cause, lease.ErrExpiring)
	require.ErrorIs(t, k.Stop(), lease.ErrExpiring)
}
