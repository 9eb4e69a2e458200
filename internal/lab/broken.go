package lab

// WHAT NOT TO DO.
//
// The strategies in this file are broken on purpose: they are the "check,
// then act" patterns that leak, kept to show the leak on a real server.
// Never copy them into an application, and never make package quota
// depend on them. The safe ways are pgquota's one-statement conditional
// grant (conditional.go) and, for work under a lock, a lease with a
// fencing token that the storage checks on every write (fenced.go).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// labSchema holds the broken strategies' tables in the scratch database:
// a plain counter per strategy and a TTL lock row per lock name. The lock
// table is unlogged, as a lock service keeps its locks in memory: taking
// and releasing a lock then waits for no WAL flush, so a slow disk does
// not eat into the TTL.
const labSchema = `
CREATE SCHEMA IF NOT EXISTS lab;
CREATE TABLE IF NOT EXISTS lab.counter (
    name  text   PRIMARY KEY,
    value bigint NOT NULL
);
CREATE UNLOGGED TABLE IF NOT EXISTS lab.lock (
    name       text        PRIMARY KEY,
    owner      text        NOT NULL,
    expires_at timestamptz NOT NULL
);`

func createLabSchema(ctx context.Context, env *Env) error {
	_, err := env.DB.Exec(ctx, labSchema)
	return err
}

func resetCounter(ctx context.Context, env *Env, name string) error {
	_, err := env.DB.Exec(ctx, `
		INSERT INTO lab.counter (name, value) VALUES ($1, 0)
		ON CONFLICT (name) DO UPDATE SET value = 0`, name)
	if err == nil {
		_, err = env.DB.Exec(ctx, `DELETE FROM lab.lock WHERE name = $1`, name)
	}
	return err
}

func readCounter(ctx context.Context, p *pgxpool.Pool, name string) (int64, error) {
	var v int64
	err := p.QueryRow(ctx, `SELECT value FROM lab.counter WHERE name = $1`, name).Scan(&v)
	return v, err
}

// writeCounter writes an absolute value: the write of a read-modify-write
// that trusts the value it read earlier. No token, no guard.
func writeCounter(ctx context.Context, p *pgxpool.Pool, name string, v int64) error {
	_, err := p.Exec(ctx, `UPDATE lab.counter SET value = $2 WHERE name = $1`, name, v)
	return err
}

// noLock reads the counter, thinks, and writes read+1: every request that
// read before the first write landed believes it got a unit.
type noLock struct{}

func (noLock) Name() string { return "no-lock" }
func (noLock) Safe() bool   { return false }
func (noLock) Injected(cfg Config) string {
	return fmt.Sprintf("read the counter, think %s, write read+1", cfg.Think)
}
func (noLock) Prepare(ctx context.Context, env *Env) error { return createLabSchema(ctx, env) }
func (s noLock) Reset(ctx context.Context, env *Env) error { return resetCounter(ctx, env, s.Name()) }
func (s noLock) Counter(ctx context.Context, env *Env) (int64, error) {
	return readCounter(ctx, env.DB, s.Name())
}
func (noLock) Close(context.Context, *Env) error { return nil }
func (s noLock) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
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

// locker is a lock with a time to live, taken by one owner at a time.
type locker interface {
	// tryAcquire takes the lock for owner if it is free or expired.
	tryAcquire(ctx context.Context, c *Client, owner string) (bool, error)
	// stillMine is the one-time freshness check: is the lock still owner's?
	stillMine(ctx context.Context, c *Client, owner string) (bool, error)
	release(ctx context.Context, c *Client, owner string) error
}

// lockedRequest is the naive critical section: take the lock, read, think,
// check once that the lock is still ours, (maybe pause), write read+1
// without any token, release. A pause after the check and before the write
// outlives the TTL: another holder has meanwhile read the same value, and
// both writes land.
func lockedRequest(ctx context.Context, env *Env, c *Client, l locker, counter string) (Outcome, error) {
	cfg := env.Config
	owner := fmt.Sprintf("run%d-request%d", env.Run, c.ID)
	deadline := giveUpAt(cfg)
	for {
		ok, err := l.tryAcquire(ctx, c, owner)
		if err != nil {
			return Outcome{}, err
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return Outcome{}, nil // gave up: denied
		}
		sleep(ctx, retryEvery+time.Duration(rand.Int64N(int64(retryEvery/2))))
		if ctx.Err() != nil {
			return Outcome{}, ctx.Err()
		}
	}
	release := func() error { return l.release(context.WithoutCancel(ctx), c, owner) }
	v, err := readCounter(ctx, c.Pool, counter)
	if err != nil || v >= cfg.Limit {
		return Outcome{}, errors.Join(err, release())
	}
	sleep(ctx, cfg.Think)
	mine, err := l.stillMine(ctx, c, owner)
	if err != nil || !mine {
		return Outcome{}, errors.Join(err, release())
	}
	env.Faults.Pause(ctx) // a GC pause, right after the check passed
	if err := writeCounter(ctx, c.Pool, counter, v+1); err != nil {
		return Outcome{}, errors.Join(err, release())
	}
	return Outcome{Granted: true}, release()
}

func lockInjected(cfg Config, what string) string {
	s := fmt.Sprintf("%s, TTL %s: lock, read, think %s, check once the lock is still ours", what, cfg.TTL, cfg.Think)
	if cfg.Paused > 0 && cfg.Pause > 0 {
		s += fmt.Sprintf("; the first %d past the check pause %s", cfg.Paused, cfg.Pause)
		if cfg.Pause > cfg.TTL {
			s += " (> TTL, like a GC pause)"
		}
	}
	return s + "; write read+1 with no token"
}

// naiveLock is a TTL lock row in PostgreSQL without a fencing token.
type naiveLock struct{}

func (*naiveLock) Name() string { return "naive-lock" }
func (*naiveLock) Safe() bool   { return false }
func (*naiveLock) Injected(cfg Config) string {
	return lockInjected(cfg, "lock row in PostgreSQL")
}
func (*naiveLock) Prepare(ctx context.Context, env *Env) error { return createLabSchema(ctx, env) }
func (s *naiveLock) Reset(ctx context.Context, env *Env) error {
	return resetCounter(ctx, env, s.Name())
}
func (s *naiveLock) Counter(ctx context.Context, env *Env) (int64, error) {
	return readCounter(ctx, env.DB, s.Name())
}
func (*naiveLock) Close(context.Context, *Env) error { return nil }
func (s *naiveLock) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	return lockedRequest(ctx, env, c, pgLock{name: s.Name(), ttl: env.Config.TTL}, s.Name())
}

// pgLock is the TTL lock row, expiry by the database clock.
type pgLock struct {
	name string
	ttl  time.Duration
}

func (l pgLock) tryAcquire(ctx context.Context, c *Client, owner string) (bool, error) {
	// Look first: while the lock is held, waiting requests only read (an
	// upsert that loses locks the row and commits a transaction).
	var held bool
	err := c.Pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM lab.lock WHERE name = $1 AND expires_at > clock_timestamp())`, l.name).Scan(&held)
	if err != nil || held {
		return false, err
	}
	var got string
	err = c.Pool.QueryRow(ctx, `
		INSERT INTO lab.lock AS l (name, owner, expires_at)
		VALUES ($1, $2, clock_timestamp() + $3 * interval '1 microsecond')
		ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
		WHERE l.expires_at <= clock_timestamp()
		RETURNING owner`, l.name, owner, l.ttl.Microseconds()).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (l pgLock) stillMine(ctx context.Context, c *Client, owner string) (bool, error) {
	var mine bool
	err := c.Pool.QueryRow(ctx, `
		SELECT coalesce(bool_or(owner = $2 AND expires_at > clock_timestamp()), false)
		FROM lab.lock WHERE name = $1`, l.name, owner).Scan(&mine)
	return mine, err
}

func (l pgLock) release(ctx context.Context, c *Client, owner string) error {
	_, err := c.Pool.Exec(ctx, `DELETE FROM lab.lock WHERE name = $1 AND owner = $2`, l.name, owner)
	return err
}

// redisLock is the same naive lock in Redis: SET key owner NX PX ttl,
// a GET for the freshness check, and a GET-then-DEL release. The counter
// it guards is still in PostgreSQL.
type redisLock struct {
	rdb *redis.Client
	key string
}

func (*redisLock) Name() string { return "redis-lock" }
func (*redisLock) Safe() bool   { return false }
func (*redisLock) Injected(cfg Config) string {
	return lockInjected(cfg, "Redis SET NX PX lock ("+redactURL(cfg.RedisURL)+")")
}

// redactURL returns raw for printing, its password replaced by "xxxxx".
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return u.Redacted()
}

// quietRedis keeps go-redis from logging to the process's stderr (the CLI
// writes only to the writers it is given); errors reach us as values.
var quietRedis sync.Once

type voidLogger struct{}

func (voidLogger) Printf(context.Context, string, ...any) {}

func (s *redisLock) Prepare(ctx context.Context, env *Env) error {
	quietRedis.Do(func() { redis.SetLogger(voidLogger{}) })
	if err := createLabSchema(ctx, env); err != nil {
		return err
	}
	opts, err := redis.ParseURL(env.Config.RedisURL)
	if err != nil {
		// url.Error repeats the whole URL, password included.
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err
		}
		return fmt.Errorf("redis-url: %w", err)
	}
	opts.PoolSize = env.Config.Requests
	opts.DialTimeout = time.Second
	opts.MaxRetries = -1
	s.rdb = redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.rdb.Ping(pctx).Err(); err != nil {
		_ = s.rdb.Close()
		s.rdb = nil
		return fmt.Errorf("%w: no Redis answers at %s (%v)", ErrUnavailable, redactURL(env.Config.RedisURL), err)
	}
	s.key = "pgquota:lab:" + env.Database + ":lock"
	return nil
}
func (s *redisLock) Reset(ctx context.Context, env *Env) error {
	if err := s.rdb.Del(ctx, s.key).Err(); err != nil {
		return err
	}
	return resetCounter(ctx, env, s.Name())
}
func (s *redisLock) Counter(ctx context.Context, env *Env) (int64, error) {
	return readCounter(ctx, env.DB, s.Name())
}
func (s *redisLock) Close(ctx context.Context, _ *Env) error {
	if s.rdb == nil {
		return nil
	}
	err := s.rdb.Del(ctx, s.key).Err()
	return errors.Join(err, s.rdb.Close())
}
func (s *redisLock) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	return lockedRequest(ctx, env, c, redisLocker{rdb: s.rdb, key: s.key, ttl: env.Config.TTL}, s.Name())
}

type redisLocker struct {
	rdb *redis.Client
	key string
	ttl time.Duration
}

func (l redisLocker) tryAcquire(ctx context.Context, _ *Client, owner string) (bool, error) {
	return l.rdb.SetNX(ctx, l.key, owner, l.ttl).Result()
}

func (l redisLocker) stillMine(ctx context.Context, _ *Client, owner string) (bool, error) {
	v, err := l.rdb.Get(ctx, l.key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return v == owner, err
}

func (l redisLocker) release(ctx context.Context, _ *Client, owner string) error {
	v, err := l.rdb.Get(ctx, l.key).Result()
	if errors.Is(err, redis.Nil) || (err == nil && v != owner) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.rdb.Del(ctx, l.key).Err()
}
