package lease_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// replicas returns n Clients, each on its own pool, on one fresh database:
// n replicas of an application.
func replicas(t *testing.T, n int) (*pgxpool.Pool, []*quota.Client) {
	t.Helper()
	url := pgtest.NewURL(t)
	clients := make([]*quota.Client, n)
	var first *pgxpool.Pool
	for i := range clients {
		pool := pgtest.Connect(t, url, 4)
		if i == 0 {
			first = pool
		}
		c, err := quota.New(pool, nil)
		require.NoError(t, err)
		clients[i] = c
	}
	return first, clients
}

// createRunLog creates the table in which critical sections record their
// intervals by the database clock and the number of sections running.
func createRunLog(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	// DDL on purpose, as the server's admin role (pool may be the
	// application role's); the tables are the test's own.
	u, err := url.Parse(pool.Config().ConnString())
	require.NoError(t, err)
	admin, err := url.Parse(pgtest.BaseURL(t))
	require.NoError(t, err)
	u.User = admin.User
	owner := pgtest.ConnectOwner(t, u.String(), 1)
	_, err = owner.Exec(context.Background(), `
		CREATE TABLE run_log (id bigserial PRIMARY KEY, who text NOT NULL, token bigint NOT NULL,
		                      started timestamptz NOT NULL, stopped timestamptz);
		CREATE TABLE running (id int PRIMARY KEY, active int NOT NULL, max_active int NOT NULL, runs int NOT NULL);
		INSERT INTO running VALUES (1, 0, 0, 0);
		GRANT SELECT, INSERT, UPDATE, DELETE ON run_log, running TO PUBLIC;
		GRANT USAGE ON SEQUENCE run_log_id_seq TO PUBLIC;`)
	require.NoError(t, err)
}

// section records one critical section: entered (the number running, by an
// exact counter in the database), a pause, left. It returns an error when
// another section was running at the same time.
func section(ctx context.Context, pool *pgxpool.Pool, who string, token int64, hold time.Duration) error {
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO run_log (who, token, started) VALUES ($1, $2, clock_timestamp()) RETURNING id`,
		who, token).Scan(&id); err != nil {
		return err
	}
	var active int
	if err := pool.QueryRow(ctx, `UPDATE running SET active = active + 1, max_active = greatest(max_active, active + 1), runs = runs + 1
		WHERE id = 1 RETURNING active`).Scan(&active); err != nil {
		return err
	}
	time.Sleep(hold)
	if _, err := pool.Exec(ctx, `UPDATE running SET active = active - 1 WHERE id = 1`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `UPDATE run_log SET stopped = clock_timestamp() WHERE id = $1`, id); err != nil {
		return err
	}
	if active != 1 {
		return fmt.Errorf("%s entered while %d sections ran", who, active-1)
	}
	return nil
}

func TestDoRunsOneReplicaAtATime(t *testing.T) {
	t.Parallel()
	pool, clients := replicas(t, 2)
	createRunLog(t, pool)
	ctx := context.Background()

	const rounds = 12
	errs := make(chan error, 2*rounds)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			who := fmt.Sprintf("replica-%d", i)
			for range rounds {
				err := leaseOf(t, c).Do(ctx, lease.DoRequest{Name: "nightly", Holder: who, TTL: 2 * time.Second, Wait: true},
					func(ctx context.Context) error {
						l, ok := lease.FromContext(ctx)
						if !ok {
							return errors.New("no lease in fn's context")
						}
						if _, err := fenceOf(t, c).WriteRow(ctx, fence.WriteRowRequest{
							Resource: "nightly", Key: "report", Value: who, Token: l.Token, Lease: "nightly",
						}); err != nil {
							return err
						}
						return section(ctx, pool, who, l.Token, 5*time.Millisecond)
					})
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	var runs, maxActive, overlaps, tokens int
	require.NoError(t, pool.QueryRow(ctx, `SELECT runs, max_active FROM running`).Scan(&runs, &maxActive))
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FROM run_log a JOIN run_log b ON a.id < b.id
		WHERE a.started < b.stopped AND b.started < a.stopped`).Scan(&overlaps))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT token) FROM run_log`).Scan(&tokens))
	require.Equal(t, 2*rounds, runs, "every Do ran fn once")
	require.Equal(t, 1, maxActive, "never two fn bodies at once")
	require.Zero(t, overlaps, "no two fn intervals overlap by the database clock")
	require.Equal(t, 2*rounds, tokens, "each run had a lease (and token) of its own")
	t.Logf("%d runs, at most %d at a time, %d overlapping intervals, %d distinct tokens", runs, maxActive, overlaps, tokens)

	// Every Do released its lease: it is free, not left to expire.
	l, err := leaseOf(t, clients[0]).Get(ctx, "nightly")
	require.NoError(t, err)
	require.False(t, l.Held)
}

func TestDoContextEndsBeforeExpiryWhenRenewalsBlock(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	var expiredAtEnd bool
	var cause error
	err := b.leases.Do(b.ctx, lease.DoRequest{
		Name: "blocked", Holder: "h", TTL: time.Second,
		Keepalive: &lease.KeepaliveOptions{Margin: 300 * time.Millisecond},
	}, func(ctx context.Context) error {
		unlock := b.lockLeaseRow(t, "blocked") // every renewal now waits for this lock
		defer unlock()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			return errors.New("fn's context did not end")
		}
		// A plain read is not blocked by the FOR UPDATE lock.
		if err := b.pool.QueryRow(b.ctx, `SELECT expires_at <= clock_timestamp() FROM pgquota.lease WHERE name = 'blocked'`).
			Scan(&expiredAtEnd); err != nil {
			return err
		}
		cause = context.Cause(ctx)
		return cause
	})
	require.False(t, expiredAtEnd, "fn's context ended before the database expiry")
	require.ErrorIs(t, cause, lease.ErrExpiring)
	require.ErrorIs(t, err, lease.ErrExpiring, "fn's error is returned as is")
}

func TestDoReturnsFnResultWhateverTheRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)

	t.Run("fn's error as is", func(t *testing.T) {
		mine := errors.New("report failed")
		err := b.leases.Do(b.ctx, lease.DoRequest{Name: "as-is", Holder: "h", TTL: time.Minute},
			func(context.Context) error { return mine })
		require.Same(t, mine, err)
		l, err := b.leases.Get(b.ctx, "as-is")
		require.NoError(t, err)
		require.False(t, l.Held, "released after a failed fn too")
	})

	t.Run("fn's context carries the lease", func(t *testing.T) {
		_, ok := lease.FromContext(b.ctx)
		require.False(t, ok)
		var got lease.Lease
		err := b.leases.Do(b.ctx, lease.DoRequest{Name: "carried", TTL: time.Minute, Payload: "step 1"},
			func(ctx context.Context) error {
				got, ok = lease.FromContext(ctx)
				return nil
			})
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "carried", got.Name)
		require.Equal(t, lease.DefaultHolder(), got.Holder)
		require.Equal(t, "step 1", got.Payload)
		require.True(t, got.Held)
		l, err := b.leases.Get(b.ctx, "carried")
		require.NoError(t, err)
		require.Equal(t, got.Token, l.Token)
	})

	t.Run("release fails after fn succeeded", func(t *testing.T) {
		var releaseErr error
		var token int64
		err := b.leases.Do(b.ctx, lease.DoRequest{
			Name: "taken", Holder: "h", TTL: time.Minute,
			OnReleaseError: func(l lease.Lease, err error) { releaseErr = err },
		}, func(ctx context.Context) error {
			l, _ := lease.FromContext(ctx)
			token = l.Token
			// An operator ends the lease and another holder takes it, so
			// the release after fn fails.
			if _, err := b.owner.Exec(b.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() WHERE name = 'taken'`); err != nil {
				return err
			}
			_, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "taken", Holder: "thief", TTL: time.Minute})
			return err
		})
		require.NoError(t, err, "fn succeeded: a failed release must not invite a retry of fn")
		require.ErrorIs(t, releaseErr, lease.ErrLost)
		l, err := b.leases.Get(b.ctx, "taken")
		require.NoError(t, err)
		require.Equal(t, "thief", l.Holder, "the successor's lease is left as it is")
		require.Greater(t, l.Token, token)
	})

	t.Run("panic releases", func(t *testing.T) {
		require.Panics(t, func() {
			_ = b.leases.Do(b.ctx, lease.DoRequest{Name: "panics", Holder: "h", TTL: time.Minute},
				func(context.Context) error { panic("boom") })
		})
		l, err := b.leases.Get(b.ctx, "panics")
		require.NoError(t, err)
		require.False(t, l.Held)
	})

	t.Run("held without wait", func(t *testing.T) {
		b.acquire(t, "busy", "other", time.Minute)
		ran := false
		err := b.leases.Do(b.ctx, lease.DoRequest{Name: "busy", Holder: "h", TTL: time.Minute},
			func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, lease.ErrHeld)
		require.False(t, ran)
	})

	t.Run("wait ends with ctx", func(t *testing.T) {
		b.acquire(t, "busy2", "other", time.Minute)
		ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
		defer cancel()
		ran := false
		err := b.leases.Do(ctx, lease.DoRequest{Name: "busy2", Holder: "h", TTL: time.Minute, Wait: true},
			func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, lease.ErrHeld)
		require.False(t, ran)
	})
}

func TestDoRejectsBadInputWritingNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	fn := func(context.Context) error { return nil }
	for _, tc := range []struct {
		req   lease.DoRequest
		field string
	}{
		{lease.DoRequest{Name: "", TTL: time.Second}, "lease name"},
		{lease.DoRequest{Name: "x", TTL: 0}, "ttl"},
		{lease.DoRequest{Name: "x", TTL: -time.Second}, "ttl"},
		{lease.DoRequest{Name: "x", TTL: time.Second, Holder: "a\x00b"}, "holder"},
		{lease.DoRequest{Name: "x", TTL: time.Second, Payload: "a\x00b"}, "payload"},
		{lease.DoRequest{Name: "x", TTL: time.Second, Keepalive: &lease.KeepaliveOptions{Interval: 2 * time.Second}}, "interval"},
		{lease.DoRequest{Name: "x", TTL: time.Second, Keepalive: &lease.KeepaliveOptions{Margin: time.Second}}, "margin"},
	} {
		err := b.leases.Do(b.ctx, tc.req, fn)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie, "%+v", tc.req)
		require.Equal(t, tc.field, ie.Field)
	}
	var ie *quota.InputError
	require.ErrorAs(t, b.leases.Do(b.ctx, lease.DoRequest{Name: "x", TTL: time.Second}, nil), &ie)
	require.Equal(t, "fn", ie.Field)

	var rows int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM pgquota.lease) + (SELECT count(*) FROM pgquota.fence)`).Scan(&rows))
	require.Zero(t, rows, "nothing written")
}
