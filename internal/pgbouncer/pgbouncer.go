// Package pgbouncer starts a real PgBouncer for tests: transaction pooling
// on a loopback port, in front of the test server, so that pgquota's calls
// are tried behind the pooler users deploy.
//
// A Bouncer runs pgbouncer (from $PGBOUNCER, else PATH, else
// /usr/sbin/pgbouncer; Debian's package `pgbouncer`) in the foreground as a
// child process with pool_mode = transaction, a small default_pool_size,
// auth_type = trust and one fallback database entry
// (`* = host=... port=...`), so every database of the server routes through
// it, the per-test databases of internal/pgtest included. It is stopped by
// its process id, and the kernel stops it too when the process that
// started it dies (PR_SET_PDEATHSIG). A PgBouncer that does not start fails
// the test with the tail of its log.
package pgbouncer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configures Start. The zero value is ready to use.
type Options struct {
	// PoolSize is PgBouncer's default_pool_size: the server connections
	// per database and user. Defaults to 3.
	PoolSize int
	// MaxClientConn is PgBouncer's max_client_conn. Defaults to 2000.
	MaxClientConn int
	// QueryWaitTimeout is PgBouncer's query_wait_timeout: how long a
	// client waits for a server connection before PgBouncer closes it
	// (SQLSTATE 08P01, "query_wait_timeout"). Defaults to 120s, its own
	// default; whole seconds.
	QueryWaitTimeout time.Duration
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// Port is the loopback port PgBouncer listens on.
	Port int
	// PoolSize is the server connections per database and user.
	PoolSize int
	dir      string
	cmd      *exec.Cmd
	exit     chan struct{} // closed when the process has exited
	// adminUser may connect to PgBouncer's admin console (database
	// "pgbouncer").
	adminUser string

	mu    sync.Mutex
	users map[string]string // the auth_file's users and passwords
	stop  sync.Once
}

// binary is the pgbouncer executable to run.
func binary() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	return "", errors.New("pgbouncer is not installed (Debian/Ubuntu: apt-get install -y pgbouncer; or set $PGBOUNCER to its path)")
}

// Start starts a PgBouncer in transaction mode in front of the server that
// serverURL (a postgres:// URL) points to, and stops it when the test ends.
// The user of serverURL may use its admin console.
func Start(tb testing.TB, serverURL string, opts Options) *Bouncer {
	tb.Helper()
	b, err := StartProcess(serverURL, opts)
	if err != nil {
		tb.Fatalf("pgbouncer: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("pgbouncer on port %d, log tail:\n%s", b.Port, b.LogTail(40))
		}
		b.Stop()
	})
	return b
}

// StartProcess is Start for a PgBouncer that outlives one test (one per
// test binary): the caller stops it, or it stops when this process dies.
func StartProcess(serverURL string, opts Options) (*Bouncer, error) {
	if opts.PoolSize <= 0 {
		opts.PoolSize = 3
	}
	if opts.MaxClientConn <= 0 {
		opts.MaxClientConn = 2000
	}
	if opts.QueryWaitTimeout <= 0 {
		opts.QueryWaitTimeout = 120 * time.Second
	}
	u, err := url.Parse(serverURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("server URL must be a postgres:// URL with a host, got %q", serverURL)
	}
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	// A free port picked by the kernel may be taken by someone else before
	// PgBouncer binds it: try a few.
	for range 3 {
		b, err := start(bin, u, opts)
		if err == nil {
			return b, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

// A Bouncer's files live in a directory named dirPrefix*, whose ownerFile
// holds the pid of the process that started it.
const (
	dirPrefix = "pgquota-pgbouncer-"
	ownerFile = "owner.pid"
)

// removeOrphans removes the directories of Bouncers whose starting process
// has exited without stopping them (a PgBouncer for a whole test binary
// stops with it, and nothing is left to remove its files).
func removeOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start(bin string, server *url.URL, opts Options) (*Bouncer, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pick a port: %w", err)
	}
	removeOrphans()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	host := server.Hostname()
	serverPort := server.Port()
	if serverPort == "" {
		serverPort = "5432"
	}
	admin := server.User.Username()
	pass, _ := server.User.Password()
	b := &Bouncer{Port: port, PoolSize: opts.PoolSize, dir: dir, exit: make(chan struct{}), adminUser: admin,
		users: map[string]string{admin: pass}}
	if err := b.writeUsers(); err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = transaction
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = %d
query_wait_timeout = %d
max_db_connections = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
log_connections = 0
log_disconnections = 0
logfile = %s
`, host, serverPort, port, filepath.Join(dir, "userlist.txt"), admin, opts.PoolSize, opts.MaxClientConn, int(opts.QueryWaitTimeout.Seconds()), b.logPath())
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		return nil, err
	}
	b.cmd = exec.Command(bin, iniPath)
	var out bytes.Buffer
	b.cmd.Stdout, b.cmd.Stderr = &out, &out
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		cred, err := unprivileged()
		if err != nil {
			return nil, err
		}
		b.cmd.SysProcAttr.Credential = cred
		if err := chownAll(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	startErr := make(chan error, 1)
	go func() {
		// PR_SET_PDEATHSIG fires when the thread that started the child
		// ends: this goroutine keeps that thread for as long as the child
		// runs.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := b.cmd.Start(); err != nil {
			startErr <- err
			close(b.exit)
			return
		}
		startErr <- nil
		_ = b.cmd.Wait()
		close(b.exit)
	}()
	if err := <-startErr; err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-b.exit:
			return nil, fmt.Errorf("pgbouncer exited at start (%s); its output:\n%s\nlog tail:\n%s", b.cmd.ProcessState, out.String(), b.LogTail(30))
		default:
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			conn.Close()
			return b, nil
		}
		if time.Now().After(deadline) {
			b.Stop()
			return nil, fmt.Errorf("pgbouncer did not listen on 127.0.0.1:%d within 15s; log tail:\n%s", port, b.LogTail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unprivileged returns the credentials PgBouncer runs with when the tests
// run as root: the postgres user's, else nobody's.
func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("running as root, and neither user postgres nor nobody exists to run pgbouncer as (it refuses root)")
}

func chownAll(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
}

func (b *Bouncer) logPath() string { return filepath.Join(b.dir, "pgbouncer.log") }

// writeUsers writes the auth_file. Under auth_type = trust PgBouncer asks
// clients for no password, but every user must be listed; the password is
// what it logs in to the server with, should the server ask.
func (b *Bouncer) writeUsers() error {
	var s strings.Builder
	for name, pass := range b.users {
		fmt.Fprintf(&s, "%q %q\n", name, pass)
	}
	p := filepath.Join(b.dir, "userlist.txt")
	if err := os.WriteFile(p+".tmp", []byte(s.String()), 0o644); err != nil {
		return err
	}
	if b.cmd != nil && b.cmd.SysProcAttr.Credential != nil {
		c := b.cmd.SysProcAttr.Credential
		if err := os.Chown(p+".tmp", int(c.Uid), int(c.Gid)); err != nil {
			return err
		}
	}
	return os.Rename(p+".tmp", p)
}

// URL returns dbURL (a postgres:// URL of the server behind b) rewritten to
// go through b: same user, password, database and parameters, b's host and
// port. A user PgBouncer does not know yet is added to its auth_file.
func (b *Bouncer) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("pgbouncer: want a postgres:// URL with a host, got %q", dbURL)
	}
	name := u.User.Username()
	pass, _ := u.User.Password()
	if err := b.addUser(name, pass); err != nil {
		return "", err
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	q := u.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func (b *Bouncer) addUser(name, pass string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if have, ok := b.users[name]; ok && have == pass {
		return nil
	}
	b.users[name] = pass
	if err := b.writeUsers(); err != nil {
		return err
	}
	// PgBouncer reads the auth_file at start and on RELOAD.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.admin(ctx, "RELOAD")
	return err
}

// AdminURL is the URL of PgBouncer's admin console.
func (b *Bouncer) AdminURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol",
		url.PathEscape(b.adminUser), b.Port)
}

// admin runs one command on the admin console and returns its rows, each
// column as text, keyed by column name.
func (b *Bouncer) admin(ctx context.Context, command string) ([]map[string]string, error) {
	conn, err := pgx.Connect(ctx, b.AdminURL())
	if err != nil {
		return nil, fmt.Errorf("pgbouncer admin console: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, command)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer %s: %w", command, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		vals := rows.RawValues()
		m := map[string]string{}
		for i, fd := range rows.FieldDescriptions() {
			m[fd.Name] = string(vals[i])
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Show runs `SHOW what` (SERVERS, CLIENTS, POOLS, ...) on the admin
// console and returns its rows, each column as text, keyed by column name.
func (b *Bouncer) Show(ctx context.Context, what string) ([]map[string]string, error) {
	return b.admin(ctx, "SHOW "+what)
}

// ServerChannels returns the channels that the server connections pooled
// for dbURL's database and user (a URL through b) LISTEN on, sorted, one
// entry per connection and channel. It holds PoolSize transactions open at
// once through b, so each runs on its own server connection and together
// they reach every one the pool holds (idle servers are used before new
// ones are opened), then asks each for pg_listening_channels().
func (b *Bouncer) ServerChannels(ctx context.Context, dbURL string) ([]string, error) {
	var txs []pgx.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback(context.Background())
			_ = tx.Conn().Close(context.Background())
		}
	}()
	var channels []string
	for range b.PoolSize {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return nil, err
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			_ = conn.Close(ctx)
			return nil, err
		}
		txs = append(txs, tx)
		// The first statement links the client to a server for the rest
		// of the transaction.
		rows, err := tx.Query(ctx, "SELECT pg_listening_channels()")
		if err != nil {
			return nil, err
		}
		chs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		channels = append(channels, chs...)
	}
	slices.Sort(channels)
	return channels, nil
}

// Log returns PgBouncer's log so far.
func (b *Bouncer) Log() string {
	data, _ := os.ReadFile(b.logPath())
	return string(data)
}

// LogTail returns the last n lines of PgBouncer's log.
func (b *Bouncer) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(b.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop stops PgBouncer by its process id (SIGTERM, then SIGKILL after 5s)
// and removes its files. It is safe to call more than once.
func (b *Bouncer) Stop() {
	b.stop.Do(func() {
		if b.cmd != nil && b.cmd.Process != nil {
			_ = b.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-b.exit:
			case <-time.After(5 * time.Second):
				_ = b.cmd.Process.Kill()
				<-b.exit
			}
		}
		_ = os.RemoveAll(b.dir)
	})
}
