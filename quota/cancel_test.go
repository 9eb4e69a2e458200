package quota_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

func (b *testBundle) settle(t *testing.T) { t.Helper(); b.bundle().Settle(t) }

// grantedInLedger sums the amounts of the granted grants in the ledger.
func (b *testBundle) grantedInLedger(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
		SELECT coalesce(sum(amount) FILTER (WHERE granted AND operation = 'grant'), 0)
		FROM pgquota.ledger_entry`).Scan(&n))
	return n
}

// A grant whose context is cancelled while it waits for a lock: the call
// returns the context's error, the pool stays healthy, and the counter
// reflects exactly the grants that committed, which a retry with the same
// key reports.
func TestGrantCancelledMidStatement(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// cancelRequest configures pgx to ask the server to cancel the
		// statement (CancelRequestContextWatcherHandler); by default pgx
		// only closes the connection, and the server may finish the
		// statement.
		cancelRequest bool
		inTx          bool
	}{
		{"pgx default: connection closed", false, false},
		{"pgx cancel request", true, false},
		{"in a caller's transaction", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.NewURL(t)
			cfg, err := pgxpool.ParseConfig(pgtest.SuiteURL(t, dbURL)) // the application's role under PGQUOTA_TEST_APP_ROLE=1
			require.NoError(t, err)
			cfg.MaxConns = 4
			pgtest.Reserve(t, int(cfg.MaxConns), "a pool of 4")
			if tc.cancelRequest {
				cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
					return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
				}
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			client, err := quota.New(pool, nil)
			require.NoError(t, err)
			b := &testBundle{ctx: context.Background(), pool: pool, client: client, operator: operatorOf(t, client), owner: pgtest.ConnectOwner(t, dbURL, 1)}
			b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](100)})
			_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
			require.NoError(t, err)

			// Another session locks the counter row (as the owner: FOR
			// UPDATE needs UPDATE on the table).
			blocker := pgtest.ConnectOwner(t, dbURL, 1)
			btx, err := blocker.Begin(b.ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = btx.Rollback(context.Background()) })
			_, err = btx.Exec(b.ctx, `SELECT used FROM pgquota.usage WHERE member = 'm' FOR UPDATE`)
			require.NoError(t, err)

			req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 5, Idempotency: key("k")}
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan error, 1)
			go func() {
				if !tc.inTx {
					_, err := b.client.Grant(ctx, req)
					done <- err
					return
				}
				done <- quota.RunInTx(ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
					// A first grant that the cancellation must roll back.
					if _, err := b.client.GrantTx(ctx, tx, quota.GrantRequest{Quota: "q", Member: "other", Amount: 1, Idempotency: key("first")}); err != nil {
						return err
					}
					_, err := b.client.GrantTx(ctx, tx, req)
					return err
				})
			}()
			b.waitForLockWait(t)
			cancel()
			err = <-done
			if tc.cancelRequest {
				// The server cancelled the statement and said so.
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "57014", pgErr.Code)
			} else {
				require.ErrorIs(t, err, context.Canceled)
				require.NotContains(t, err.Error(), "rollback", "a rollback on a closed connection is no error")
			}
			if tc.cancelRequest || tc.inTx {
				// The server said the statement was cancelled; or the
				// statement was in a transaction that cannot commit now.
				require.NotErrorIs(t, err, quota.ErrOutcomeUnknown)
			} else {
				// The statement was sent and may still commit.
				require.ErrorIs(t, err, quota.ErrOutcomeUnknown)
			}

			// The pool is healthy: the next calls succeed.
			for i := range 10 {
				r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: fmt.Sprint("n", i), Amount: 1})
				require.NoError(t, err)
				require.True(t, r.Granted)
			}
			require.Eventually(t, func() bool { return b.pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 5*time.Millisecond)

			require.NoError(t, btx.Rollback(b.ctx))
			b.settle(t)
			sum, _ := b.usageRows(t, "q", "m")
			inLedger := b.grantedInLedger(t)
			require.Equal(t, 1+inLedger, sum, "the counter holds exactly the committed grants")
			if tc.cancelRequest || tc.inTx {
				require.Zero(t, inLedger, "the cancelled statement did not commit")
				require.Zero(t, b.countRows(t, "ledger"))
			}
			sum, _ = b.usageRows(t, "q", "other")
			require.Zero(t, sum)

			// A retry with the same key grants once in total.
			r, err := b.client.Grant(b.ctx, req)
			require.NoError(t, err)
			require.True(t, r.Granted)
			require.Equal(t, inLedger > 0, r.Replayed)
			sum, _ = b.usageRows(t, "q", "m")
			require.Equal(t, int64(6), sum)
		})
	}
}

// Keyed grants cancelled at random points: afterwards the counter equals the
// units of the committed grants in the ledger, and retrying every key
// grants each exactly once.
func TestGrantCancelledAtRandom(t *testing.T) {
	t.Parallel()
	const keys = 200
	b := setup(t, 8)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)})
	// Warm the pool up, so that the timeouts hit statements rather than
	// connection setups.
	concurrently(8, func(i int) {
		_, err := b.client.Usage(b.ctx, "q", "m")
		require.NoError(t, err)
	})
	const workers = 8
	var cancelled atomic.Int64
	concurrently(workers, func(w int) {
		for i := w; i < keys; i += workers {
			// Every other call has no timeout: pgx closes a connection
			// whose statement was cancelled, and these calls open new ones
			// (a connection setup takes longer than most timeouts here).
			ctx, cancel := context.WithCancel(b.ctx)
			if i%2 == 0 {
				ctx, cancel = context.WithTimeout(b.ctx, time.Duration(rand.IntN(10_000))*time.Microsecond)
			}
			_, err := b.client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key(fmt.Sprint("k", i))})
			cancel()
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("grant %d: %v", i, err)
				}
				cancelled.Add(1)
			}
		}
	})
	b.settle(t)
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, b.grantedInLedger(t), sum, "the counter holds exactly the committed grants")
	t.Logf("%d of %d grants cancelled; %d committed", cancelled.Load(), keys, sum)

	concurrently(keys, func(i int) {
		r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key(fmt.Sprint("k", i))})
		if err != nil || !r.Granted {
			t.Errorf("retry %d: %+v %v", i, r, err)
		}
	})
	sum, _ = b.usageRows(t, "q", "m")
	require.Equal(t, int64(keys), sum, "every key granted exactly once")
	require.Equal(t, int64(keys), b.ledgerRows(t))
	require.Zero(t, b.pool.Stat().AcquiredConns())
}

// The first reply of a keyed grant is lost after the grant committed; the
// retry with the same key reports the committed grant and grants nothing
// more.
func TestGrantKeyedRetryAfterLostReply(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	direct := pgtest.Connect(t, dbURL, 4)
	client, err := quota.New(direct, nil)
	require.NoError(t, err)
	b := &testBundle{ctx: context.Background(), pool: direct, client: client, operator: operatorOf(t, client), owner: pgtest.ConnectOwner(t, dbURL, 1)}
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](1)})

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy := newReplyDropper(t, u.Host)
	u.Host = proxy.Ln.Addr().String()
	viaProxy, err := quota.New(pgtest.Connect(t, u.String(), 1), nil)
	require.NoError(t, err)
	// A Client's first grant on a quota name reads the quota's kind first
	// (and remembers it): take that statement out of the way, so that the
	// reply dropped below is the grant's own.
	warm, err := viaProxy.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "warm-up", Amount: 1})
	require.NoError(t, err)
	require.True(t, warm.Granted)

	req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: key("order-42")}
	proxy.Armed.Store(true)
	_, err = viaProxy.Grant(b.ctx, req)
	require.Error(t, err, "the reply was lost")
	select {
	case <-proxy.Dropped:
	default:
		t.Fatalf("the proxy dropped no reply; the call failed with %v", err)
	}

	// The grant committed: the counter and the ledger say so.
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(1), sum)
	entry, err := b.client.LedgerEntryByKey(b.ctx, quota.IdempotencyKey{Scope: "q", Key: "order-42"})
	require.NoError(t, err)
	require.True(t, entry.Granted)

	// The client retries (through the same proxy, now passing replies).
	r, err := viaProxy.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.True(t, r.Replayed)
	require.Equal(t, entry.GrantID, r.GrantID)
	r, err = b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, r.Replayed)
	sum, _ = b.usageRows(t, "q", "m")
	require.Equal(t, int64(1), sum, "one unit granted")

	// Without a key the retry grants again: the limit of 1 denies it here,
	// which is the duplicate a key prevents.
	r, err = viaProxy.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.False(t, r.Granted)
}
