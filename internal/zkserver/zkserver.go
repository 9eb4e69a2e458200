// Package zkserver starts a standalone ZooKeeper server (Debian's package
// zookeeper: /usr/share/java/zookeeper.jar, run with Java 17) on a free
// loopback port, with its own configuration and data directory, for the
// lab and the tests. It is stopped by process id, and killed with the
// process that started it.
package zkserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// DefaultJar is where Debian's package puts ZooKeeper's jar (its manifest
// names the jars it needs).
const DefaultJar = "/usr/share/java/zookeeper.jar"

// Options configure a server. The zero value is usable.
type Options struct {
	// TickTime is ZooKeeper's tickTime: the unit of its session timeouts
	// and how often it expires sessions. Defaults to 100ms, which lets
	// sessions last as little as 2 ticks (200ms).
	TickTime time.Duration
	// StartTimeout bounds the wait for the server to answer. Defaults to
	// 60s (a JVM on a busy machine).
	StartTimeout time.Duration
}

// Server is a running ZooKeeper server.
type Server struct {
	// Addr is host:port of its client port, on 127.0.0.1.
	Addr string
	// TickTime is the server's tickTime.
	TickTime time.Duration

	proc *svcproc.Proc
	dir  string
}

// Install says how to get what the server needs.
const Install = "install Debian's zookeeper package (apt-get install -y zookeeper; it brings Java), or set PGQUOTA_ZOOKEEPER_JAR and JAVA_HOME"

// java finds the JVM and the jars: JAVA_HOME/bin/java or java on PATH;
// PGQUOTA_ZOOKEEPER_JAR or DefaultJar, and an SLF4J binding that logs to
// stderr when Debian has one (else the server logs nothing).
func java() (bin string, classpath string, err error) {
	bin = "java"
	if h := os.Getenv("JAVA_HOME"); h != "" {
		bin = filepath.Join(h, "bin", "java")
	}
	if bin, err = exec.LookPath(bin); err != nil {
		return "", "", fmt.Errorf("%w: no java (%v): %s", ErrMissing, err, Install)
	}
	jar := os.Getenv("PGQUOTA_ZOOKEEPER_JAR")
	if jar == "" {
		jar = DefaultJar
	}
	if _, err := os.Stat(jar); err != nil {
		return "", "", fmt.Errorf("%w: no %s: %s", ErrMissing, jar, Install)
	}
	classpath = jar
	if _, err := os.Stat("/usr/share/java/slf4j-simple.jar"); err == nil {
		classpath += ":/usr/share/java/slf4j-simple.jar"
	}
	return bin, classpath, nil
}

// Start starts a standalone server and waits until it serves (ZooKeeper's
// four-letter "srvr"). The error names what to install when Java or the jar is missing,
// and carries the server's log tail when it does not come up.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.TickTime <= 0 {
		opts.TickTime = 100 * time.Millisecond
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	bin, cp, err := java()
	if err != nil {
		return nil, err
	}
	var last error
	for range 3 {
		s, err := start(ctx, bin, cp, opts)
		if err == nil {
			return s, nil
		}
		last = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, last
}

func start(ctx context.Context, bin, cp string, opts Options) (*Server, error) {
	port, err := svcproc.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgquota-zookeeper-")
	if err != nil {
		return nil, err
	}
	tick := opts.TickTime.Milliseconds()
	cfg := fmt.Sprintf(`tickTime=%d
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
minSessionTimeout=%d
maxSessionTimeout=%d
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
`, tick, filepath.Join(dir, "data"), port, 2*tick, 600*tick)
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), TickTime: opts.TickTime, dir: dir}
	s.proc, err = svcproc.Start(ctx, svcproc.Spec{
		Name: "zookeeper", Path: bin, Dir: dir, ReadyTimeout: opts.StartTimeout, Ready: s.srvr,
		Args: []string{"-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-Dzookeeper.admin.enableServer=false",
			"-cp", cp, "org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath},
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// srvr sends ZooKeeper's four-letter "srvr" and wants a server that
// serves ("ruok" answers "imok" before the server takes requests).
func (s *Server) srvr(ctx context.Context) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("srvr")); err != nil {
		return err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "Mode: standalone") {
		return fmt.Errorf("srvr answered %q", b)
	}
	return nil
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.proc.Pid() }

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string { return s.proc.LogTail(n) }

// Stop stops the server by its process id and removes its data.
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
		tb.Fatalf("zookeeper: %v", err)
	}
	svcproc.StopAtEnd(tb, "zookeeper at "+s.Addr, s, s.Stop)
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the test binary's one ZooKeeper server (default Options),
// starting it on first use: a JVM takes a second or more to start. It is
// killed when the test binary exits. A server that cannot start fails the
// test.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.once.Do(func() { shared.s, shared.err = Start(context.Background(), Options{}) })
	if shared.err != nil {
		tb.Fatalf("zookeeper: %v", shared.err)
	}
	if shared.s.proc.HasExited() {
		tb.Fatalf("zookeeper: the shared server at %s has exited; log tail:\n%s", shared.s.Addr, shared.s.LogTail(40))
	}
	return shared.s
}

// ErrMissing is wrapped by Start's error when Java or ZooKeeper is not
// installed.
var ErrMissing = errors.New("zookeeper is not installed")
