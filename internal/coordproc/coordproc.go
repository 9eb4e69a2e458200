// Package coordproc starts the coordination servers of the lab and of the
// recipe tests (ZooKeeper, etcd) as child processes: on loopback, on free
// ports, in a directory of their own, killed with the process that started
// them (PR_SET_PDEATHSIG) and stopped by process id. A server that does not
// come up is an error that carries the tail of its log.
//
// It is the small common part of internal/zkserver and internal/etcdserver.
package coordproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ownerFile, in a server's directory, holds the pid of the process that
// started it, so that a later start removes the directories of servers
// whose starter died without stopping them.
const ownerFile = "owner.pid"

// Proc is a running server process.
type Proc struct {
	// Name says what the server is, for errors ("zookeeper").
	Name string
	// Dir is the server's own directory (data, config, log); removed by
	// Stop.
	Dir string
	// LogPath is the file the process's stdout and stderr go to.
	LogPath string

	cmd  *exec.Cmd
	exit chan struct{}
	stop sync.Once
}

// MakeDir makes a fresh directory for a server, named prefix* under the
// system's temporary directory, after removing the orphans of earlier
// processes with that prefix.
func MakeDir(prefix string) (string, error) {
	removeOrphans(prefix)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

func removeOrphans(prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1. Another process
// may take one before the server binds it: callers retry a start that
// failed with "address already in use".
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Start starts bin with args in dir, its output in dir/name.log. The
// process gets SIGKILL when the thread that started it ends, which is when
// this process dies.
func Start(name, dir, bin string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, Dir: dir, LogPath: filepath.Join(dir, name+".log"), exit: make(chan struct{})}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	startErr := make(chan error, 1)
	go func() {
		// PR_SET_PDEATHSIG fires when the thread that started the child
		// ends: this goroutine keeps that thread for as long as the child
		// runs.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logf.Close()
		if err := p.cmd.Start(); err != nil {
			startErr <- err
			close(p.exit)
			return
		}
		startErr <- nil
		_ = p.cmd.Wait()
		close(p.exit)
	}()
	if err := <-startErr; err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	return p, nil
}

// Pid is the server's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// WaitReady calls probe until it succeeds, the process exits, or timeout
// passes; the error of the last two carries the log's tail.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration, probe func(ctx context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		last = probe(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.exit:
			return fmt.Errorf("%s exited at start (%s); log tail:\n%s", p.Name, p.cmd.ProcessState, p.LogTail(30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %s (%v); log tail:\n%s", p.Name, timeout, last, p.LogTail(30))
		}
	}
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}

// Log returns the server's output so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// LogTail returns the last n lines of the server's output.
func (p *Proc) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Kill kills the process by its id (SIGKILL) and waits for it, keeping its
// directory (a crash: the data stays for a restart).
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exit
}

// Stop stops the process by its id (SIGTERM, then SIGKILL after 5s) and
// removes its directory. Safe to call more than once.
func (p *Proc) Stop() {
	p.stop.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exit:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exit
		}
		_ = os.RemoveAll(p.Dir)
	})
}
