package bench

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgquota/pgquota/internal/svcproc"
)

// RedisServer is a redis-server the bench started through svcproc: on a
// free loopback port, stopped by its process id, killed with the bench.
type RedisServer struct {
	*svcproc.Redis
	// Version is the server's redis_version.
	Version string
}

// StartRedis starts redis-server ($PGQUOTA_REDIS_SERVER, else
// redis-server on $PATH) without persistence, as Debian starts it, or,
// durable, with --appendonly yes --appendfsync always (every write fsynced
// before its reply). Errors: the binary missing (saying what to install),
// or a server that did not answer PING (with its log tail).
func StartRedis(ctx context.Context, durable bool) (*RedisServer, error) {
	r, err := svcproc.StartRedis(ctx, svcproc.RedisOptions{Durable: durable})
	if err != nil {
		return nil, err
	}
	s := &RedisServer{Redis: r}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				s.Version = v
			}
		}
	}
	return s, nil
}

// Stop stops the server by its process id.
func (s *RedisServer) Stop() { _ = s.Redis.Stop() }
