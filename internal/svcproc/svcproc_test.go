package svcproc_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgquota/pgquota/internal/svcproc"
	"github.com/redis/go-redis/v9"
)

// A server that exits before it is ready fails Start with its log tail.
func TestStartReportsLogTailOfServerThatExits(t *testing.T) {
	t.Parallel()
	_, err := svcproc.Start(context.Background(), svcproc.Spec{
		Name:  "failing",
		Path:  "sh",
		Args:  []string{"-c", "echo cannot bind port 1234 >&2; exit 7"},
		Ready: func(context.Context) error { return os.ErrNotExist },
	})
	if err == nil || !strings.Contains(err.Error(), "cannot bind port 1234") || !strings.Contains(err.Error(), "exit status 7") {
		t.Fatalf("Start error = %v, want the exit status and the log tail", err)
	}
}

// A server that never becomes ready is stopped and reported after ReadyTimeout.
func TestStartStopsServerThatIsNeverReady(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := svcproc.Start(context.Background(), svcproc.Spec{
		Name:         "sleeper",
		Path:         "sh",
		Args:         []string{"-c", "echo $$ > pid; echo starting; exec sleep 60"},
		Dir:          dir,
		Ready:        func(context.Context) error { return os.ErrNotExist },
		ReadyTimeout: 300 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "not ready") || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("Start error = %v, want not ready with the log tail", err)
	}
	b, rerr := os.ReadFile(filepath.Join(dir, "pid"))
	if rerr != nil {
		t.Fatal(rerr)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("process %d still runs after a failed Start", pid)
	}
}

// A Redis started durable fsyncs every write, and one killed and started
// again on its port without persistence has forgotten its keys.
func TestRedisDurableAndRestartForgets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := svcproc.StartRedisT(t, svcproc.RedisOptions{Durable: true})
	c := redis.NewClient(&redis.Options{Addr: d.Addr})
	defer c.Close()
	cfg, err := c.ConfigGet(ctx, "appendfsync").Result()
	if err != nil || cfg["appendfsync"] != "always" {
		t.Fatalf("appendfsync = %v (%v), want always", cfg, err)
	}

	r := svcproc.StartRedisT(t, svcproc.RedisOptions{})
	c2 := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c2.Close()
	if err := c2.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(r.Addr[strings.LastIndexByte(r.Addr, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	r2 := svcproc.StartRedisT(t, svcproc.RedisOptions{Port: p})
	c3 := redis.NewClient(&redis.Options{Addr: r2.Addr})
	defer c3.Close()
	if n, err := c3.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart without persistence: exists = %d (%v), want 0", n, err)
	}
}
