// Package svcproc starts the real servers pgquota's tests, lab and bench run
// beside it (redis-server, ZooKeeper, etcd, Prometheus...) as child
// processes on loopback ports, and stops them by process id.
//
// A Proc runs one server in the foreground with its output in a log file of
// its own directory. Start waits until the Spec's Ready probe answers and,
// when it does not in time or the process exits first, stops the process and
// returns an error that carries the tail of its log, so that a server that
// fails to start fails the run with the reason. The kernel kills the server
// when the process that started it dies (PR_SET_PDEATHSIG), so nothing is
// left running after a crashed test; nothing here ever signals a process by
// name.
package svcproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Spec describes a server to start.
type Spec struct {
	// Name names the server in messages and its log file, e.g. "redis-server".
	Name string
	// Path is the executable (a path, or a name looked up in PATH).
	Path string
	// Args are its arguments.
	Args []string
	// Env, when not nil, is added to the environment it inherits.
	Env []string
	// Dir is its working directory. Defaults to a new temporary directory
	// that Stop removes.
	Dir string
	// Ready reports nil once the server serves. Start calls it every 50ms
	// until it does, the process exits, or ReadyTimeout passes. Defaults to
	// "the process is still running after 200ms".
	Ready func(ctx context.Context) error
	// ReadyTimeout bounds the wait for Ready. Defaults to 30s.
	ReadyTimeout time.Duration
}

// Proc is a running server.
type Proc struct {
	// Name is Spec.Name.
	Name string
	// Dir is the server's working directory, where its log file is.
	Dir string
	// LogPath is the file that holds the server's stdout and stderr.
	LogPath string

	cmd     *exec.Cmd
	tempDir bool
	exited  chan struct{}
	waitErr error
	stop    sync.Once
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TCPReady is a Ready probe that succeeds once addr accepts a connection.
func TCPReady(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// Start starts the server and waits until it is ready. The error of a
// server that did not start says why and ends with the tail of its log.
func Start(ctx context.Context, spec Spec) (*Proc, error) {
	if spec.Name == "" {
		spec.Name = filepath.Base(spec.Path)
	}
	bin, err := exec.LookPath(spec.Path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	p := &Proc{Name: spec.Name, Dir: spec.Dir, exited: make(chan struct{})}
	if p.Dir == "" {
		if p.Dir, err = os.MkdirTemp("", "pgquota-"+sanitize(spec.Name)+"-"); err != nil {
			return nil, err
		}
		p.tempDir = true
	}
	p.LogPath = filepath.Join(p.Dir, sanitize(spec.Name)+".log")
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, spec.Args...)
	p.cmd.Dir = p.Dir
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if spec.Env != nil {
		p.cmd.Env = append(os.Environ(), spec.Env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		p.cleanup()
		return nil, fmt.Errorf("%s: start %s: %w", spec.Name, bin, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()

	timeout := spec.ReadyTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ready := spec.Ready
	if ready == nil {
		ready = func(ctx context.Context) error {
			select {
			case <-time.After(200 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		select {
		case <-p.exited:
			err := fmt.Errorf("%s exited before it was ready (%v); log tail:\n%s", spec.Name, p.waitErr, p.LogTail(30))
			p.cleanup()
			return nil, err
		default:
		}
		actx, acancel := context.WithTimeout(rctx, time.Second)
		lastErr = ready(actx)
		acancel()
		if lastErr == nil {
			select {
			case <-p.exited: // Ready raced with an exit: report the exit
				continue
			default:
			}
			return p, nil
		}
		select {
		case <-rctx.Done():
			tail := p.LogTail(30)
			_ = p.Stop()
			return nil, fmt.Errorf("%s not ready after %v (last probe: %v); log tail:\n%s", spec.Name, timeout, lastErr, tail)
		case <-p.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StartT is Start for a test: it fails tb with the reason and the log tail
// when the server does not start, and stops it when the test ends (printing
// its log tail first when the test failed).
func StartT(tb testing.TB, spec Spec) *Proc {
	tb.Helper()
	p, err := Start(context.Background(), spec)
	if err != nil {
		tb.Fatalf("svcproc: %v", err)
	}
	StopAtEnd(tb, p.Name, p, func() { _ = p.Stop() })
	return p
}

// Pid is the server's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the server's process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// HasExited reports whether the server's process has exited.
func (p *Proc) HasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Server is what StopAtEnd needs of a started server: a Proc, or a wrapper
// around one (Redis, etcdserver.Server, zkserver.Server).
type Server interface {
	Pid() int
	LogTail(n int) string
}

// StopAtEnd runs stop when tb ends, after logging the last 40 lines of the
// server's log, named what ("etcd at 127.0.0.1:2379"), when tb failed.
func StopAtEnd(tb testing.TB, what string, s Server, stop func()) {
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s (pid %d), log tail:\n%s", what, s.Pid(), s.LogTail(40))
		}
		stop()
	})
}

// Signal sends sig to the server's process (by its id), e.g. SIGSTOP and
// SIGCONT to pause and resume it.
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return errors.New(p.Name + " has exited")
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Kill kills the server at once (SIGKILL), as a crash would, and waits for
// it to exit. Its directory is kept, so a server can be started again on
// the same data; Stop removes it.
func (p *Proc) Kill() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused process still dies, but be sure it is reaped
	err := p.cmd.Process.Kill()
	<-p.exited
	return err
}

// Stop stops the server: SIGTERM by process id (SIGCONT first, in case it
// was paused), SIGKILL when it has not exited after 10s. It then removes the
// server's directory when Start made it. Stop may be called more than once.
func (p *Proc) Stop() error {
	var err error
	p.stop.Do(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				err = p.cmd.Process.Kill()
				<-p.exited
			}
		}
		p.cleanup()
	})
	return err
}

func (p *Proc) cleanup() {
	if p.tempDir {
		_ = os.RemoveAll(p.Dir)
	}
}

// LogTail returns the last n lines of the server's log.
func (p *Proc) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' {
			return '-'
		}
		return r
	}, s)
}
