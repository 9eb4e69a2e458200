package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server the bench started on loopback, stopped by
// its process id (and killed with the bench: Pdeathsig).
//
// TODO(integrator): move onto internal/svcproc once it is on main; it was
// not when this was written.
type RedisServer struct {
	Addr    string
	Version string
	cmd     *exec.Cmd
	dir     string
	done    chan struct{}
}

// StartRedis starts redis-server (path, or "redis-server" on $PATH) on a
// free loopback port in a temporary directory: without persistence (no RDB
// snapshots, no AOF) or, durable, with --appendonly yes --appendfsync
// always (every write fsynced before its reply). It fails with the log's
// last lines when the server does not answer PING within 10 seconds.
func StartRedis(ctx context.Context, path string, durable bool) (*RedisServer, error) {
	if path == "" {
		path = "redis-server"
	}
	bin, err := exec.LookPath(path)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (%w): install it (apt-get install redis-server) or pass --redis-path", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir, err := os.MkdirTemp("", "pgquota-bench-redis-")
	if err != nil {
		return nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log")}
	if durable {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &RedisServer{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := rdb.Info(pctx, "server").Result()
		cancel()
		if err == nil {
			for _, line := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
					s.Version = v
				}
			}
			return s, nil
		}
		select {
		case <-s.done:
			err = errors.New("redis-server exited")
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil || s.exited() {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			s.Stop()
			return nil, fmt.Errorf("redis-server on %s did not start: %w; log tail:\n%s", s.Addr, err, lastLines(string(log), 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *RedisServer) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stop kills the server by its process id and removes its directory.
func (s *RedisServer) Stop() {
	if s.cmd.Process != nil && !s.exited() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	_ = os.RemoveAll(s.dir)
}
