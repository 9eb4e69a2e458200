package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/pgquota/pgquota/internal/svcproc"
)

// redisServer is one redis-server process the lab starts on a loopback
// port through internal/svcproc, without persistence (no RDB snapshots, no
// AOF): a restart forgets every key, as an instance restarted without
// persistence does in Kleppmann's analysis of Redlock. It is stopped by its
// process id and dies with the lab's process (svcproc's Pdeathsig).
type redisServer struct {
	bin  string
	dir  string
	name string
	port int

	mu   sync.Mutex
	proc *svcproc.Proc
}

// redisStartTimeout is how long a redis-server may take to answer PING.
const redisStartTimeout = 10 * time.Second

// redisBinary resolves Config.RedisServer: empty means svcproc's choice
// ($PGQUOTA_REDIS_SERVER, else redis-server in PATH).
func redisBinary(bin string) (string, error) {
	if bin == "" {
		return svcproc.RedisBinary()
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("redis-server %q not found (install Debian's redis-server package, or set --redis-server): %w", bin, err)
	}
	return path, nil
}

// startRedis starts redis-server bin (see redisBinary) on a free loopback
// port, its log in dir, and waits until it answers PING. The error of a
// server that does not start carries the tail of its log.
func startRedis(ctx context.Context, bin, dir, name string) (*redisServer, error) {
	path, err := redisBinary(bin)
	if err != nil {
		return nil, err
	}
	port, err := svcproc.FreePort()
	if err != nil {
		return nil, fmt.Errorf("find a free loopback port: %w", err)
	}
	s := &redisServer{bin: path, dir: dir, name: name, port: port}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Addr is the server's host:port.
func (s *redisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// PID is the running process's id, 0 when none runs.
func (s *redisServer) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.Pid()
}

// start runs the process on s.port and waits for PING.
func (s *redisServer) start(ctx context.Context) error {
	p, err := svcproc.Start(ctx, svcproc.Spec{
		Name: s.name,
		Path: s.bin,
		Args: []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(s.port),
			"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no"},
		Dir:          s.dir,
		Ready:        svcproc.RedisReady(s.Addr()),
		ReadyTimeout: redisStartTimeout,
	})
	if err != nil {
		return fmt.Errorf("redis-server %s on port %d did not start: %w", s.name, s.port, err)
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// ping sends one PING and expects PONG.
func ping(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return svcproc.RedisReady(addr)(ctx)
}

// kill kills the process by its id (SIGKILL) and waits for it to exit.
func (s *redisServer) kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		_ = p.Kill()
	}
}

// restart kills the process (SIGKILL, no shutdown save: there is no
// persistence anyway) and starts a new one on the same port. It returns
// the old and new process ids and how long the server was not answering.
func (s *redisServer) restart(ctx context.Context) (oldPID, newPID int, down time.Duration, err error) {
	oldPID = s.PID()
	t0 := time.Now()
	s.kill()
	if err := s.start(ctx); err != nil {
		return oldPID, 0, time.Since(t0), err
	}
	return oldPID, s.PID(), time.Since(t0), nil
}

// tcpProxy forwards loopback connections to a target. Cut makes it reset
// every connection, open or new: to the client behind it, the target has
// become unreachable (a network partition whose packets are rejected),
// while the listener keeps its port, so nothing else can take it.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newTCPProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is where clients connect.
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// SetCut cuts (true) or restores (false) the path to the target; cutting
// also resets the connections open now.
func (p *tcpProxy) SetCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			reset(c)
		}
	}
}

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *tcpProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			reset(c)
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(c)
	}
}

func (p *tcpProxy) pipe(c net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		_ = c.Close()
	}()
	up, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		reset(c)
		return
	}
	p.mu.Lock()
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, up)
		p.mu.Unlock()
		_ = up.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done // either side ended: close both (the deferred Closes)
	_ = c.Close()
	_ = up.Close()
	<-done
}

// Close stops the proxy and closes its connections.
func (p *tcpProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
