// Package pgcluster runs throwaway PostgreSQL servers for tests that crash,
// restart or fail over a server: the shared test server (pgtest) must never
// be stopped, so these tests get their own.
//
// A Cluster is a data directory in a temporary folder (initdb) served by a
// postgres process that the test starts itself, listening on a free port
// of 127.0.0.1 only (no Unix socket). It can be shut down in immediate mode
// (a crash: the last asynchronous commits are lost, recovery replays the
// WAL at the next start), restarted, copied into a streaming standby with
// pg_basebackup -R, and a standby can be cut off from its primary and
// promoted. Every server is stopped by process id in tb.Cleanup. A server
// that does not start fails the test with the tail of its log.
//
// The binaries come from $PGQUOTA_PG_BIN, else `pg_config --bindir`, else
// the newest /usr/lib/postgresql/*/bin. When the test runs as root (CI),
// initdb, pg_basebackup and postgres run as the OS user postgres, since
// PostgreSQL refuses to run as root.
package pgcluster

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver migrations.Up takes

	"github.com/pgquota/pgquota/migrations"
)

// EnvBin names the environment variable that can point at the PostgreSQL
// binaries' folder (initdb, postgres, pg_basebackup).
const EnvBin = "PGQUOTA_PG_BIN"

// startTimeout bounds how long a server may take to accept connections,
// crash recovery included.
const startTimeout = 90 * time.Second

// Cluster is one throwaway PostgreSQL server.
type Cluster struct {
	tb   testing.TB
	bin  string
	cred *syscall.Credential
	root string // the temporary folder: data/ and server.log

	// Name is the name given to New or NewStandby, used in messages.
	Name string
	// DataDir is the server's data directory.
	DataDir string
	// Port is the TCP port on 127.0.0.1 the server listens on; it stays the
	// same across restarts.
	Port int

	mu      sync.Mutex
	proc    *os.Process
	exited  chan struct{}
	logPath string
}

// Options are settings written into postgresql.conf, as name = value
// (value as PostgreSQL parses it, quoted where needed).
type Options map[string]string

// New creates a cluster with initdb (trust authentication, superuser
// postgres), writes its settings (wal_level replica so it can have
// standbys, plus opts) and starts it.
func New(tb testing.TB, name string, opts Options) *Cluster {
	tb.Helper()
	c := newCluster(tb, name)
	c.run("initdb", "--no-sync", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-D", c.DataDir)
	settings := Options{
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": "''",
		"max_connections":         "40",
		"shared_buffers":          "16MB",
		"wal_level":               "replica",
		"max_wal_senders":         "4",
		"wal_keep_size":           "'64MB'",
		"hot_standby":             "on",
		"fsync":                   "on",
		"log_min_messages":        "warning",
	}
	for k, v := range opts {
		settings[k] = v
	}
	c.appendConf(settings)
	c.Start()
	return c
}

// NewStandby makes a streaming standby of c: pg_basebackup -R (a
// primary_conninfo pointing at c, standby.signal), started on a port of its
// own. It waits until the standby has replayed everything c has written.
func (c *Cluster) NewStandby(name string) *Cluster {
	c.tb.Helper()
	return c.newCopy(name, true, "-R")
}

// NewStandbyWithSlot is NewStandby with a physical replication slot: c
// gets the permanent slot (pg_basebackup -C -S slot) and the standby
// streams through it (primary_slot_name), so c knows the standby, and how
// far it has flushed, also while it is disconnected (pg_replication_slots).
func (c *Cluster) NewStandbyWithSlot(name, slot string) *Cluster {
	c.tb.Helper()
	return c.newCopy(name, true, "-R", "-C", "-S", slot)
}

// NewCopy makes a base backup of c (pg_basebackup, without -R) and starts
// it as a cluster of its own: it recovers to the end of the backup and
// goes on as a primary on c's timeline with c's system identifier, as a
// restored base backup or file-system snapshot started without a
// recovery.signal does.
func (c *Cluster) NewCopy(name string) *Cluster {
	c.tb.Helper()
	return c.newCopy(name, false)
}

func (c *Cluster) newCopy(name string, standby bool, args ...string) *Cluster {
	c.tb.Helper()
	s := newCluster(c.tb, name)
	c.run("pg_basebackup", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-D", s.DataDir, "-X", "stream", "-c", "fast", "--no-sync"}, args...)...)
	s.appendConf(Options{"port": strconv.Itoa(s.Port)})
	s.Start()
	if standby {
		c.WaitReplayed(s)
	}
	return s
}

func newCluster(tb testing.TB, name string) *Cluster {
	tb.Helper()
	bin, err := binDir()
	if err != nil {
		tb.Fatalf("pgcluster: %v", err)
	}
	c := &Cluster{tb: tb, bin: bin, Name: name}
	root, err := os.MkdirTemp("", "pgcluster-"+name+"-")
	if err != nil {
		tb.Fatalf("pgcluster: %v", err)
	}
	c.root = root
	c.DataDir = filepath.Join(root, "data")
	c.logPath = filepath.Join(root, "server.log")
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("pgcluster: running as root, and there is no OS user postgres to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(root, uid, gid); err != nil {
			tb.Fatalf("pgcluster: %v", err)
		}
	}
	c.Port = freePort(tb)
	tb.Cleanup(func() {
		c.stop(syscall.SIGQUIT)
		if tb.Failed() {
			tb.Logf("pgcluster %s: tail of %s:\n%s", c.Name, c.logPath, c.logTail())
		}
		_ = os.RemoveAll(c.root)
	})
	return c
}

// BinDir returns the folder of the PostgreSQL binaries the clusters run
// (see the package comment), for helpers that look for the server's files
// beside them (internal/cituscluster looks for citus.so).
func BinDir() (string, error) { return binDir() }

// binDir finds the PostgreSQL binaries.
func binDir() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres): install the server package "+
		"(Debian: postgresql-15) or set %s to their folder", EnvBin)
}

// freePort asks the kernel for a free port on 127.0.0.1.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pgcluster: no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// run runs one of the PostgreSQL binaries to completion.
func (c *Cluster) run(name string, args ...string) {
	c.tb.Helper()
	cmd := c.command(name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.tb.Fatalf("pgcluster %s: %s %s: %v\n%s", c.Name, name, strings.Join(args, " "), err, out)
	}
}

func (c *Cluster) appendConf(settings Options) {
	c.tb.Helper()
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("\n# pgcluster\n")
	if _, ok := settings["port"]; !ok {
		fmt.Fprintf(&b, "port = %d\n", c.Port)
	}
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	f, err := os.OpenFile(filepath.Join(c.DataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.Write(b.Bytes())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		c.tb.Fatalf("pgcluster %s: write postgresql.conf: %v", c.Name, err)
	}
}

// Start starts the server (after New it already runs) and waits until it
// accepts connections, crash recovery included.
func (c *Cluster) Start() {
	c.tb.Helper()
	c.mu.Lock()
	if c.proc != nil {
		c.mu.Unlock()
		c.tb.Fatalf("pgcluster %s: already running", c.Name)
	}
	logFile, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.mu.Unlock()
		c.tb.Fatalf("pgcluster %s: %v", c.Name, err)
	}
	cmd := c.command("postgres", "-D", c.DataDir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		c.mu.Unlock()
		c.tb.Fatalf("pgcluster %s: start postgres: %v", c.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	c.proc, c.exited = cmd.Process, exited
	c.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := c.connect(ctx, "postgres")
		if err == nil {
			conn.Close(ctx)
			cancel()
			return
		}
		cancel()
		select {
		case <-exited:
			c.mu.Lock()
			c.proc = nil
			c.mu.Unlock()
			c.tb.Fatalf("pgcluster %s: postgres exited during start (port %d). Tail of its log:\n%s", c.Name, c.Port, c.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stop(syscall.SIGQUIT)
			c.tb.Fatalf("pgcluster %s: not accepting connections after %s (port %d): %v. Tail of its log:\n%s",
				c.Name, startTimeout, c.Port, err, c.logTail())
		}
	}
}

// Crash shuts the server down in immediate mode (SIGQUIT to the postmaster,
// as pg_ctl stop -m immediate sends): no checkpoint, WAL not yet written by
// the WAL writer is lost, and the next Start runs crash recovery. It waits
// until the postmaster has exited.
func (c *Cluster) Crash() {
	c.tb.Helper()
	if !c.stop(syscall.SIGQUIT) {
		c.tb.Fatalf("pgcluster %s: not running", c.Name)
	}
}

// Stop shuts the server down in fast mode (SIGINT) and waits for it.
func (c *Cluster) Stop() {
	c.tb.Helper()
	if !c.stop(syscall.SIGINT) {
		c.tb.Fatalf("pgcluster %s: not running", c.Name)
	}
}

// stop signals the postmaster and waits until it has exited; false when it
// was not running.
func (c *Cluster) stop(sig syscall.Signal) bool {
	c.mu.Lock()
	p, exited := c.proc, c.exited
	c.proc = nil
	c.mu.Unlock()
	if p == nil {
		return false
	}
	_ = p.Signal(sig)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = p.Kill()
		<-exited
	}
	return true
}

// logTail returns the last lines of the server's log.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// URL returns the libpq URL of database on the server, as superuser
// postgres (trust authentication), or as role user when one is given.
func (c *Cluster) URL(database string, user ...string) string {
	u := "postgres"
	if len(user) > 0 {
		u = user[0]
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", u, c.Port, database)
}

// connect opens the helper's own connection to database as postgres. It
// drops the options of $PGOPTIONS (CI runs a pass with
// default_transaction_isolation=serializable, which a hot standby refuses):
// the helper's statements need none of them. Pools from Pool keep them.
func (c *Cluster) connect(ctx context.Context, database string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(c.URL(database))
	if err != nil {
		return nil, err
	}
	delete(cfg.RuntimeParams, "options")
	return pgx.ConnectConfig(ctx, cfg)
}

// Exec runs SQL statements (no parameters, several allowed) as postgres in
// database.
func (c *Cluster) Exec(database, statements string) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := c.connect(ctx, database)
	if err != nil {
		c.tb.Fatalf("pgcluster %s: connect: %v", c.Name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, statements, pgx.QueryExecModeSimpleProtocol); err != nil {
		c.tb.Fatalf("pgcluster %s: %s: %v", c.Name, statements, err)
	}
}

// QueryValue runs a query as postgres in database and scans its one value
// into dest.
func (c *Cluster) QueryValue(database, query string, dest any, args ...any) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := c.connect(ctx, database)
	if err != nil {
		c.tb.Fatalf("pgcluster %s: connect: %v", c.Name, err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, query, args...).Scan(dest); err != nil {
		c.tb.Fatalf("pgcluster %s: %s: %v", c.Name, query, err)
	}
}

// CreateDatabase creates database name and applies pgquota's migrations to
// it.
func (c *Cluster) CreateDatabase(name string) {
	c.tb.Helper()
	c.Exec("postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	db, err := sql.Open("pgx", c.URL(name))
	if err != nil {
		c.tb.Fatalf("pgcluster %s: %v", c.Name, err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := migrations.Up(ctx, db); err != nil {
		c.tb.Fatalf("pgcluster %s: migrate %s: %v", c.Name, name, err)
	}
}

// Pool opens a pgx pool on url, closed in tb.Cleanup.
func Pool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		tb.Fatalf("pgcluster: open pool on %s: %v", url, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// WaitReplayed waits until standby has replayed all WAL that c has written
// so far.
func (c *Cluster) WaitReplayed(standby *Cluster) {
	c.tb.Helper()
	var lsn string
	c.QueryValue("postgres", "SELECT pg_current_wal_lsn()::text", &lsn)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var ok bool
		standby.QueryValue("postgres", "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", &ok, lsn)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("pgcluster: standby %s has not replayed %s of %s after 60s", standby.Name, lsn, c.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CutOff stops the standby c from receiving WAL: primary_conninfo is
// emptied (ALTER SYSTEM, reload) and it waits until the WAL receiver is
// gone. From then on the standby misses every commit of its primary; it
// keeps serving reads and can be promoted.
func (c *Cluster) CutOff() {
	c.tb.Helper()
	c.Exec("postgres", "ALTER SYSTEM SET primary_conninfo = ''")
	c.Exec("postgres", "SELECT pg_reload_conf()")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		c.QueryValue("postgres", "SELECT count(*)::int FROM pg_stat_wal_receiver", &n)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("pgcluster %s: the WAL receiver still runs 30s after primary_conninfo was emptied", c.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PauseReplay pauses WAL replay on the standby c (pg_wal_replay_pause) and
// waits until it is paused. WAL is still received, and a promotion replays
// what was received first: use CutOff to make a standby miss commits.
func (c *Cluster) PauseReplay() {
	c.tb.Helper()
	c.Exec("postgres", "SELECT pg_wal_replay_pause()")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		c.QueryValue("postgres", "SELECT pg_get_wal_replay_pause_state()", &state)
		if state == "paused" {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("pgcluster %s: replay not paused after 30s (state %s)", c.Name, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Promote promotes the standby c with pg_promote() and waits for the
// promotion to finish.
func (c *Cluster) Promote() {
	c.tb.Helper()
	var ok bool
	c.QueryValue("postgres", "SELECT pg_promote(true, 60)", &ok)
	if !ok {
		c.tb.Fatalf("pgcluster %s: pg_promote() did not finish within 60s", c.Name)
	}
}
