package lab

// WHAT NOT TO DO (as broken.go): the article's non-atomic Redis lock.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisNaive is the background article's naive Redis lock: GET the key to
// see that it is free, then SET it (two commands, not SET NX), on a
// redis-server of its own that the lab starts on a loopback port. Every
// request that GETs before the first SET lands believes it holds the lock;
// each then reads the counter, thinks, and writes read+1 with no token
// and no freshness check, and deletes the key. The race between the check
// and the set is the whole failure; the one fault injected widens it to
// what a network round trip between the two commands costs
// (redisNaiveGap), as the article's requests over HTTP/2 paid, so that it
// shows on a busy machine too, where the requests start less together.
type redisNaive struct {
	srv *redisServer
	dir string
	rdb *redis.Client
}

const redisNaiveKey = "pgquota:lab:redis-naive:lock"

// redisNaiveGap is the time between the GET and the SET of redis-naive.
const redisNaiveGap = 10 * time.Millisecond

func (*redisNaive) Name() string { return "redis-naive" }
func (*redisNaive) Safe() bool   { return false }
func (*redisNaive) Injected(cfg Config) string {
	return fmt.Sprintf("the article's non-atomic Redis lock on a redis-server started for the lab: GET the key, "+
		"if free wait %s (a network round trip) and SET it PX %s (not NX), read, think %s, write read+1 with no token, DEL; no pause",
		redisNaiveGap, cfg.TTL, cfg.Think)
}

func (s *redisNaive) Prepare(ctx context.Context, env *Env) (err error) {
	quietRedis.Do(func() { redis.SetLogger(voidLogger{}) })
	if err := createLabSchema(ctx, env); err != nil {
		return err
	}
	if s.dir, err = os.MkdirTemp("", "pgquota-lab-redis-naive-"); err != nil {
		return err
	}
	if s.srv, err = startRedis(ctx, env.Config.RedisServer, s.dir, "redis-naive"); err != nil {
		_ = os.RemoveAll(s.dir)
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	s.rdb = redis.NewClient(&redis.Options{Addr: s.srv.Addr(), PoolSize: env.Config.Requests, MaxRetries: -1, DialTimeout: time.Second})
	return warmRedis(ctx, s.rdb, env.Config.Requests)
}

// warmRedis opens n connections in rdb's pool before the first run, so
// that every request starts on a connection of its own, as the requests'
// PostgreSQL connections do (dialing them in the race would space the
// requests out by the dials).
func warmRedis(ctx context.Context, rdb *redis.Client, n int) error {
	conns := make([]*redis.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close() // back to the pool, open
		}
	}()
	for range n {
		c := rdb.Conn()
		conns = append(conns, c)
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("open Redis connections: %w", err)
		}
	}
	return nil
}

func (s *redisNaive) Reset(ctx context.Context, env *Env) error {
	if err := s.rdb.Del(ctx, redisNaiveKey).Err(); err != nil {
		return err
	}
	return resetCounter(ctx, env, s.Name())
}

func (s *redisNaive) Counter(ctx context.Context, env *Env) (int64, error) {
	return readCounter(ctx, env.DB, s.Name())
}

func (s *redisNaive) Close(context.Context, *Env) error {
	var err error
	if s.rdb != nil {
		err = s.rdb.Close()
	}
	if s.srv != nil {
		s.srv.kill()
	}
	if s.dir != "" {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}

func (s *redisNaive) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	cfg := env.Config
	owner := fmt.Sprintf("run%d-request%d", env.Run, c.ID)
	deadline := giveUpAt(cfg)
	for {
		// The check...
		_, err := s.rdb.Get(ctx, redisNaiveKey).Result()
		if errors.Is(err, redis.Nil) {
			// ...then the act, by another command a round trip later: not
			// atomic.
			sleep(ctx, redisNaiveGap)
			if err := s.rdb.Set(ctx, redisNaiveKey, owner, cfg.TTL).Err(); err != nil {
				return Outcome{}, err
			}
			break
		}
		if err != nil {
			return Outcome{}, err
		}
		if time.Now().After(deadline) {
			return Outcome{}, nil // gave up: denied
		}
		sleep(ctx, retryEvery+time.Duration(rand.Int64N(int64(retryEvery/2))))
		if ctx.Err() != nil {
			return Outcome{}, ctx.Err()
		}
	}
	hold := Hold{From: time.Now()}
	out, err := s.critical(ctx, env, c)
	hold.Until = time.Now()
	out.Holds = []Hold{hold}
	// The naive release: DEL, whoever's key it is by now.
	return out, errors.Join(err, s.rdb.Del(context.WithoutCancel(ctx), redisNaiveKey).Err())
}

func (s *redisNaive) critical(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	v, err := readCounter(ctx, c.Pool, s.Name())
	if err != nil || v >= env.Config.Limit {
		return Outcome{}, err
	}
	sleep(ctx, env.Config.Think)
	if err := writeCounter(ctx, c.Pool, s.Name(), v+1); err != nil {
		return Outcome{}, err
	}
	return Outcome{Granted: true}, nil
}
