// Package etcdserver starts a single-member etcd server (Debian's package
// etcd-server: /usr/bin/etcd, 3.4) on free loopback client and peer ports,
// with its own data directory, for the lab and the tests. It is stopped by
// process id, and killed with the process that started it.
package etcdserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgquota/pgquota/internal/svcproc"
)

// Install says how to get etcd.
const Install = "install Debian's etcd-server package (apt-get install -y etcd-server), or set PGQUOTA_ETCD to the etcd binary"

// ErrMissing is wrapped by Start's error when etcd is not installed.
var ErrMissing = errors.New("etcd is not installed")

// Options configure a server. The zero value is usable.
type Options struct {
	// DataDir, when set, is the data directory to use (and keep): a server
	// started again on it has the same keys and revisions. Defaults to a
	// fresh directory removed by Stop.
	DataDir string
	// StartTimeout bounds the wait for the server to answer. Defaults to
	// 30s.
	StartTimeout time.Duration
}

// Server is a running etcd server.
type Server struct {
	// Endpoint is its client URL, http://127.0.0.1:port.
	Endpoint string
	// DataDir is its data directory.
	DataDir string

	proc *svcproc.Proc
	dir  string
}

func binary() (string, error) {
	if p := os.Getenv("PGQUOTA_ETCD"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("%w: PGQUOTA_ETCD=%s: %v: %s", ErrMissing, p, err, Install)
		}
		return p, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	return "", fmt.Errorf("%w: %s", ErrMissing, Install)
}

// Start starts a single-member server and waits until its /health says
// true. Its heartbeat is 25ms and its election timeout 250ms, so that
// leases may be as short as 1 second (etcd's floor is 1.5 election
// timeouts, in whole seconds). The error carries the log tail when it does
// not come up.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	var last error
	for range 3 {
		s, err := start(ctx, bin, opts)
		if err == nil {
			return s, nil
		}
		last = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, last
}

func start(ctx context.Context, bin string, opts Options) (*Server, error) {
	cport, err := svcproc.FreePort()
	if err != nil {
		return nil, err
	}
	pport, err := svcproc.FreePort()
	if err != nil {
		return nil, err
	}
	if pport == cport {
		return nil, errors.New("etcd: picked the same free port twice: address already in use")
	}
	dir, err := os.MkdirTemp("", "pgquota-etcd-")
	if err != nil {
		return nil, err
	}
	data := opts.DataDir
	if data == "" {
		data = filepath.Join(dir, "data")
	}
	client := "http://127.0.0.1:" + strconv.Itoa(cport)
	peer := "http://127.0.0.1:" + strconv.Itoa(pport)
	s := &Server{Endpoint: client, DataDir: data, dir: dir}
	s.proc, err = svcproc.Start(ctx, svcproc.Spec{
		Name: "etcd", Path: bin, Dir: dir, ReadyTimeout: opts.StartTimeout, Ready: s.health,
		Args: []string{"--name", "lab",
			"--data-dir", data,
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "lab=" + peer,
			"--heartbeat-interval", "25", "--election-timeout", "250",
			"--log-level", "warn", "--logger", "zap"},
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b [256]byte
	n, _ := resp.Body.Read(b[:])
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b[:n]), `"health":"true"`) {
		return fmt.Errorf("/health: %s %s", resp.Status, b[:n])
	}
	return nil
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.proc.Pid() }

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string { return s.proc.LogTail(n) }

// Stop stops the server by its process id and removes its directory (and
// the data directory, unless Options.DataDir named one).
func (s *Server) Stop() {
	_ = s.proc.Stop()
	_ = os.RemoveAll(s.dir)
}

// StartTB starts a server for one test and stops it when the test ends; a
// server that cannot start fails the test with the reason.
func StartTB(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := Start(context.Background(), opts)
	if err != nil {
		tb.Fatalf("etcd: %v", err)
	}
	svcproc.StopAtEnd(tb, "etcd at "+s.Endpoint, s, s.Stop)
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the test binary's one etcd server, starting it on first
// use. It is killed when the test binary exits. A server that cannot start
// fails the test.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.once.Do(func() { shared.s, shared.err = Start(context.Background(), Options{}) })
	if shared.err != nil {
		tb.Fatalf("etcd: %v", shared.err)
	}
	if shared.s.proc.HasExited() {
		tb.Fatalf("etcd: the shared server at %s has exited; log tail:\n%s", shared.s.Endpoint, shared.s.LogTail(40))
	}
	return shared.s
}
