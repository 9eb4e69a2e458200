package svcproc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisOptions configures StartRedis. The zero value starts a Redis as
// Debian's package starts the shared one here: no snapshots, no append-only
// file, so it keeps nothing on disk.
type RedisOptions struct {
	// Port is the loopback port to listen on. Defaults to a free one; set it
	// to start a Redis again on the port of one that was killed.
	Port int
	// Durable runs it with --appendonly yes --appendfsync always: every
	// write is fsynced before the reply, like a durable PostgreSQL commit.
	Durable bool
	// Dir is its working directory (where an append-only file goes).
	// Defaults to a new temporary directory.
	Dir string
	// Args are extra redis-server arguments.
	Args []string
}

// Redis is a running redis-server.
type Redis struct {
	*Proc
	// Addr is host:port, for go-redis Options.Addr.
	Addr string
	// Durable says whether it fsyncs every write.
	Durable bool
}

// RedisBinary is the redis-server executable: $PGQUOTA_REDIS_SERVER or
// redis-server in PATH (Debian's package redis-server).
func RedisBinary() (string, error) {
	if p := os.Getenv("PGQUOTA_REDIS_SERVER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("redis-server is not installed (Debian/Ubuntu: apt-get install -y redis-server)")
}

// StartRedis starts a redis-server on 127.0.0.1 and waits until it answers
// PING.
func StartRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	bin, err := RedisBinary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--daemonize", "no"}
		if opts.Durable {
			args = append(args, "--appendonly", "yes", "--appendfsync", "always")
		} else {
			args = append(args, "--appendonly", "no")
		}
		args = append(args, opts.Args...)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := Start(ctx, Spec{
			Name:         "redis-server-" + strconv.Itoa(port),
			Path:         bin,
			Args:         args,
			Dir:          opts.Dir,
			Ready:        RedisReady(addr),
			ReadyTimeout: time.Minute, // a busy machine: waited for, not raced
		})
		if err == nil {
			return &Redis{Proc: p, Addr: addr, Durable: opts.Durable}, nil
		}
		lastErr = err
		if opts.Port != 0 || !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

// StartRedisT is StartRedis for a test: it fails tb with the log tail when
// the server does not start and stops it when the test ends.
func StartRedisT(tb testing.TB, opts RedisOptions) *Redis {
	tb.Helper()
	r, err := StartRedis(context.Background(), opts)
	if err != nil {
		tb.Fatalf("svcproc: %v", err)
	}
	StopAtEnd(tb, r.Name+" at "+r.Addr, r, func() { _ = r.Stop() })
	return r
}

// RedisReady is a Ready probe that succeeds once the Redis at addr answers
// PING with PONG.
func RedisReady(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "+PONG") {
			return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
		}
		return nil
	}
}
