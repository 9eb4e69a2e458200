package lab

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"
)

// blackhole makes a client's connections to a lock service go silent on
// demand: while it is closed, no byte goes out and none that arrives is
// handed to the client, as when the client's process is stopped (a long GC
// pause, SIGSTOP) or its network is partitioned. The server then hears no
// heartbeat and expires the client's session or lease while the client
// sleeps; the client's own code runs on when it wakes, believing it still
// holds the lock. The connections are real TCP connections to the real
// server: only their delivery is held back, never faked.
type blackhole struct {
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool
}

func newBlackhole() *blackhole {
	b := &blackhole{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// hold stops all traffic of the connections dialed through b.
func (b *blackhole) hold() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// release lets the traffic flow again.
func (b *blackhole) release() {
	b.mu.Lock()
	b.closed = false
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *blackhole) wait() {
	b.mu.Lock()
	for b.closed {
		b.cond.Wait()
	}
	b.mu.Unlock()
}

// dial dials addr over TCP and wraps the connection in the blackhole.
func (b *blackhole) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		return nil, err
	}
	return &holeConn{Conn: c, b: b}, nil
}

// zkDial is dial with the signature of zk.Dialer.
func (b *blackhole) zkDial(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return b.dial(ctx, addr)
}

type holeConn struct {
	net.Conn
	b *blackhole
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

// pauseHolder is the lab's GC pause for a lock-service client: the first
// Config.Paused requests that get here sleep d with their connections to
// the lock service blackholed. It reports whether the caller paused.
func (f *Faults) pauseHolder(ctx context.Context, d time.Duration, b *blackhole) bool {
	if d <= 0 || f.n.Add(1) > f.paused {
		return false
	}
	b.hold()
	defer b.release()
	sleep(ctx, d)
	return true
}

// oneLine is err's text on one line (a server's log tail joined with " | "),
// at most 400 bytes, for a strategy's unavailable reason.
func oneLine(err error) string {
	s := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " | ")), " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}
