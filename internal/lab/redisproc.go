package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// redisServer is one redis-server process the lab starts on a loopback
// port, without persistence (no RDB snapshots, no AOF): a restart forgets
// every key, as an instance restarted without persistence does in
// Kleppmann's analysis of Redlock. It is stopped by its process id (SIGKILL)
// and dies with the lab's process (Pdeathsig, on Linux).
type redisServer struct {
	bin  string
	dir  string
	name string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	log  string
}

// redisStartTimeout is how long a redis-server may take to answer PING.
const redisStartTimeout = 10 * time.Second

// startRedis starts redis-server bin (a name looked up in PATH, or a
// path) on a free loopback port, its log in dir/name.log, and waits until
// it answers PING. The error of a server that does not start carries the
// tail of its log.
func startRedis(ctx context.Context, bin, dir, name string) (*redisServer, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server %q not found (install Debian's redis-server package, or set --redis-server): %w", bin, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &redisServer{bin: path, dir: dir, name: name, port: port, log: filepath.Join(dir, name+".log")}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Addr is the server's host:port.
func (s *redisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// PID is the running process's id, 0 when none runs.
func (s *redisServer) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// start runs the process on s.port and waits for PING.
func (s *redisServer) start(ctx context.Context) error {
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--protected-mode", "yes", "--daemonize", "no", "--loglevel", "notice")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	done := make(chan struct{})
	started := make(chan error, 1)
	// Pdeathsig fires when the thread that started the child exits: start
	// and wait on a thread locked to this goroutine for the child's life.
	go func() {
		runtime.LockOSThread()
		defer close(done)
		defer logf.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		<-done
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := s.waitReady(ctx, done); err != nil {
		s.kill()
		return fmt.Errorf("redis-server %s on port %d did not start: %w; log tail:\n%s", s.name, s.port, err, s.logTail())
	}
	return nil
}

// waitReady polls PING until the server answers +PONG.
func (s *redisServer) waitReady(ctx context.Context, exited <-chan struct{}) error {
	deadline := time.Now().Add(redisStartTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("the process exited")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if last = ping(s.Addr()); last == nil {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("no PONG within %s (last: %v)", redisStartTimeout, last)
}

// ping sends one inline PING and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// kill sends SIGKILL to the process by its id and waits for it to exit.
func (s *redisServer) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
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

// logTail returns the last lines of the server's log.
func (s *redisServer) logTail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
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
