package httprate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/httprate"
)

type mwBundle struct {
	ctx    context.Context
	client *quota.Client
	pool   *pgxpool.Pool
	owner  *pgxpool.Pool
}

// mwSetup returns a client on a fresh migrated database (pool of at most
// maxConns), and defines, as the database's owner, each quota of defs.
func mwSetup(t *testing.T, maxConns int32, defs ...quota.Definition) *mwBundle {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	var cfg quota.Config
	if pgtest.Pooled(t) {
		cfg.Pooler = quota.PoolerTransaction
	}
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), maxConns)
	c, err := quota.New(pool, &cfg)
	require.NoError(t, err)
	owner := pgtest.ConnectOwner(t, dbURL, 2)
	operator, err := quota.New(owner, nil)
	require.NoError(t, err)
	for _, d := range defs {
		_, err := operator.DefineQuota(ctx, d)
		require.NoError(t, err)
	}
	return &mwBundle{ctx: ctx, client: c, pool: pool, owner: owner}
}

// used is the sum of the counters of quota q for member m in
// pgquota.usage.
func (b *mwBundle) used(t *testing.T, q, m string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = $1 AND member = $2`, q, m).Scan(&n))
	return n
}

func headerKey(r *http.Request) (string, error) { return r.Header.Get("X-API-Key"), nil }

// apiKey is the configuration most tests use: quota "api", keyed by the
// X-API-Key header.
var apiKey = httprate.MiddlewareConfig{Quota: "api", Key: headerKey}

// handler returns okHandler(calls) behind cfg's middleware.
func (b *mwBundle) handler(t *testing.T, cfg httprate.MiddlewareConfig, calls *atomic.Int64) http.Handler {
	t.Helper()
	mw, err := httprate.Middleware(b.client, cfg)
	require.NoError(t, err)
	return mw(okHandler(calls))
}

// serve sends h a GET / with key as its X-API-Key, under ctx, and returns
// the response.
func serve(ctx context.Context, h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	req.Header.Set("X-API-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// okHandler answers 200 "ok" and counts its calls; it checks that the
// request's context carries the grant.
func okHandler(calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok := httprate.ResultFromContext(r.Context())
		if !ok || !res.Granted {
			http.Error(w, "no grant in the context", http.StatusTeapot)
			return
		}
		calls.Add(1)
		_, _ = io.WriteString(w, "ok")
	})
}

// Limit 3 a day: three requests pass with their RateLimit fields, the
// fourth is answered 429 with Retry-After (whole seconds to the end of the
// day) and never reaches the handler; another key has its own counter.
func TestMiddlewarePassesUpToTheLimitThenAnswers429(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, 2, quota.Definition{Name: "api", Window: quota.WindowDay, DefaultLimit: quota.Limit(3)})
	var calls atomic.Int64
	h := b.handler(t, apiKey, &calls)

	for i := 1; i <= 3; i++ {
		rec := serve(b.ctx, h, "k1")
		require.Equal(t, http.StatusOK, rec.Code, "request %d", i)
		require.Equal(t, "ok", rec.Body.String())
		require.Regexp(t, fmt.Sprintf(`^"api";r=%d;t=\d+$`, 3-i), rec.Header().Get(httprate.HeaderRateLimit), "request %d", i)
		require.Regexp(t, `^"api";q=3;w=86400$`, rec.Header().Get(httprate.HeaderPolicy))
		require.Empty(t, rec.Header().Get(httprate.HeaderRetryAfter))
	}
	rec := serve(b.ctx, h, "k1")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	ra, err := strconv.Atoi(rec.Header().Get(httprate.HeaderRetryAfter))
	require.NoError(t, err, "Retry-After is whole seconds: %q", rec.Header().Get(httprate.HeaderRetryAfter))
	require.True(t, ra >= 1 && ra <= 86400, "Retry-After %d is within the day", ra)
	require.Contains(t, rec.Body.String(), `rate limit "api" reached`)
	require.Equal(t, int64(3), calls.Load(), "the denied request never reached the handler")
	require.Equal(t, int64(3), b.used(t, "api", "k1"), "a denial counts nothing")

	require.Equal(t, http.StatusOK, serve(b.ctx, h, "k2").Code, "another key has its own counter")
	require.Equal(t, int64(1), b.used(t, "api", "k2"))
}

// Hundreds of concurrent requests through a real HTTP server: exactly the
// limit pass, the rest are 429, and the counter in pgquota.usage equals
// the number that passed.
func TestMiddlewareConcurrentRequestsCounterEqualsPassed(t *testing.T) {
	t.Parallel()
	const limit, requests = 37, 200
	b := mwSetup(t, 8, quota.Definition{Name: "api", Window: quota.WindowHour, DefaultLimit: quota.Limit(limit)})
	var calls atomic.Int64
	srv := httptest.NewServer(b.handler(t, apiKey, &calls))
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 32}, Timeout: time.Minute}

	var wg sync.WaitGroup
	var ok, denied, other atomic.Int64
	start := make(chan struct{})
	for range requests {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			req.Header.Set("X-API-Key", "shared")
			resp, err := hc.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			switch resp.StatusCode {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				if resp.Header.Get(httprate.HeaderRetryAfter) == "" {
					other.Add(1)
					return
				}
				denied.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	require.Zero(t, other.Load(), "every request is a 200 or a 429 with Retry-After")
	require.Equal(t, int64(limit), ok.Load())
	require.Equal(t, int64(requests-limit), denied.Load())
	require.Equal(t, int64(limit), calls.Load())
	require.Equal(t, ok.Load(), b.used(t, "api", "shared"), "the counter equals the requests that passed")
}

// A key that fails or is no valid member is a 400 that counts nothing; a
// quota that is not defined is a 500; a bad configuration is refused by
// Middleware, naming the field.
func TestMiddlewareBadKeyIs400AndMisconfigurationIs500(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, 2, quota.Definition{Name: "api", Window: quota.WindowDay, DefaultLimit: quota.Limit(3)})
	var calls atomic.Int64
	send := func(cfg httprate.MiddlewareConfig, key string) *httptest.ResponseRecorder {
		return serve(b.ctx, b.handler(t, cfg, &calls), key)
	}
	errNoKey := errors.New("no API key")
	failing := func(*http.Request) (string, error) { return "", errNoKey }
	var seen error
	rec := send(httprate.MiddlewareConfig{Quota: "api", Key: failing, OnError: func(w http.ResponseWriter, r *http.Request, err error) {
		seen = err
		httprate.WriteError(w, r, err)
	}}, "")
	require.Equal(t, http.StatusBadRequest, rec.Code)
	var ke *httprate.KeyError
	require.ErrorAs(t, seen, &ke)
	require.ErrorIs(t, seen, errNoKey)
	require.Equal(t, http.StatusBadRequest, send(apiKey, "").Code, "an empty key")
	require.Equal(t, http.StatusBadRequest, send(apiKey, "a\x01b").Code, "a control character")

	rec = send(httprate.MiddlewareConfig{Quota: "undefined", Key: headerKey}, "k")
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, rec.Body.String(), "misconfigured")
	require.Zero(t, calls.Load())
	var rows int64
	require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.usage`).Scan(&rows))
	require.Zero(t, rows, "nothing was counted")

	for _, tc := range []struct {
		cfg   httprate.MiddlewareConfig
		field string
	}{
		{httprate.MiddlewareConfig{Key: headerKey}, "Quota"},
		{httprate.MiddlewareConfig{Quota: "a", Quotas: []string{"b"}, Key: headerKey}, "Quota"},
		{httprate.MiddlewareConfig{Quota: "api"}, "Key"},
		{httprate.MiddlewareConfig{Quota: "api", Key: headerKey, Amount: -1}, "Amount"},
	} {
		_, err := httprate.Middleware(b.client, tc.cfg)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.ErrorIs(t, err, quota.ErrInvalidInput)
		require.Equal(t, tc.field, ie.Field)
	}
	_, err := httprate.Middleware(nil, apiKey)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
}

// A grant whose statement was sent and got no reply (the request's context
// ended while the grant waited on the counter's row lock) is answered 503
// saying the request may have been counted, with Retry-After; a database
// that cannot be reached (a closed pool: nothing sent) is a 503 saying it
// was not counted.
func TestMiddlewareDatabaseErrorsAre503AndSayWhetherCounted(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, 2, quota.Definition{Name: "api", Window: quota.WindowNone, DefaultLimit: quota.Limit(100)})
	var calls atomic.Int64
	h := b.handler(t, apiKey, &calls)
	require.Equal(t, http.StatusOK, serve(b.ctx, h, "k").Code, "the first request creates the counter row")

	tx, err := b.owner.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(b.ctx, `SELECT * FROM pgquota.usage WHERE quota_name = 'api' AND member = 'k' FOR UPDATE`)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	rec := serve(ctx, h, "k")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Equal(t, "1", rec.Header().Get(httprate.HeaderRetryAfter))
	require.Contains(t, rec.Body.String(), "outcome unknown")
	require.Contains(t, rec.Body.String(), "may have been counted")
	require.NoError(t, tx.Rollback(b.ctx))
	require.Equal(t, int64(1), calls.Load(), "the unknown request was not served")

	b.pool.Close()
	rec = serve(b.ctx, h, "k")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "was not counted")
	require.Equal(t, int64(1), calls.Load())
}
