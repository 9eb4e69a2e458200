// Package netpause holds back a client's network traffic on demand: a
// Blackhole's connections are real TCP connections whose bytes, while it is
// held, neither go out nor reach the client, as when the client's process is
// stopped (a long GC pause, SIGSTOP) or the network between it and its
// server is cut. The lab and the recipe tests use it to make a lock
// service's server expire a holder's session or lease for real while the
// holder sleeps.
package netpause

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"
)

// Blackhole makes a client's connections to a lock service go silent on
// demand: while it is closed, no byte goes out and none that arrives is
// handed to the client, as when the client's process is stopped (a long GC
// pause, SIGSTOP) or its network is partitioned. The server then hears no
// heartbeat and expires the client's session or lease while the client
// sleeps; the client's own code runs on when it wakes, believing it still
// holds the lock. The connections are real TCP connections to the real
// server: only their delivery is held back, never faked.
type Blackhole struct {
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool
}

// New returns an open Blackhole.
func New() *Blackhole {
	b := &Blackhole{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Hold stops all traffic of the connections dialed through b.
func (b *Blackhole) Hold() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// Release lets the traffic flow again.
func (b *Blackhole) Release() {
	b.mu.Lock()
	b.closed = false
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *Blackhole) wait() {
	b.mu.Lock()
	for b.closed {
		b.cond.Wait()
	}
	b.mu.Unlock()
}

// Dial dials addr (host:port, or an http:// URL) over TCP and wraps the
// connection in b; its signature is grpc.WithContextDialer's.
func (b *Blackhole) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		return nil, err
	}
	return &holeConn{Conn: c, b: b}, nil
}

// ZKDial is Dial with the signature of go-zookeeper's zk.Dialer.
func (b *Blackhole) ZKDial(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return b.Dial(ctx, addr)
}

type holeConn struct {
	net.Conn
	b *Blackhole
}

// Read hands what arrived to the client only once the hole is open: a read
// already waiting in the kernel when the hole closed returns its bytes
// after the pause, as a stopped process would read them.
func (c *holeConn) Read(p []byte) (int, error) {
	c.b.wait()
	n, err := c.Conn.Read(p)
	c.b.wait()
	return n, err
}

func (c *holeConn) Write(p []byte) (int, error) {
	c.b.wait()
	return c.Conn.Write(p)
}
