package quota_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgbouncer"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// A coalescing client whose PgBouncer is killed under it returns errors
// that name the call (one "pgquota: grant: " prefix, where it returned a
// bare "conn closed") and classify it: a keyed call, whose transaction
// never began, is not ErrOutcomeUnknown; nothing was written for any call
// (read on a direct connection afterwards).
func TestCoalescedGrantErrorsNameTheCallWhenPoolerDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pgbouncer.Start(t, pgtest.BaseURL(t), pgbouncer.Options{PoolSize: 4})
	dbURL := pgtest.NewURL(t)
	// As the application's role under PGQUOTA_TEST_APP_ROLE=1: the pooler
	// learns the login from the URL it is given (SuiteURL's).
	pooled, err := b.URL(pgtest.SuiteURL(t, dbURL))
	require.NoError(t, err)
	pool := pgtest.Connect(t, pooled+"&default_query_exec_mode=exec", 8)
	client, err := quota.New(pool, &quota.Config{Grouping: quota.GroupByCounter, Pooler: quota.PoolerTransaction, RetryMaxElapsed: time.Second})
	require.NoError(t, err)
	// Defined directly (not through the pooler, which is stopped below)
	// by the operator's role.
	op, err := quota.New(pgtest.ConnectOperator(t, dbURL, 1), nil)
	require.NoError(t, err)
	_, err = op.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(100))})
	require.NoError(t, err)
	// Warm every connection of the pool, then kill the pooler under them.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client.Usage(ctx, "q", "warm")
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	b.Stop()

	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}
			if i%2 == 1 {
				req.Idempotency = quota.IdempotencyKey{Key: "k" + string(rune('a'+i))}
			}
			_, errs[i] = client.Grant(ctx, req)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.Error(t, err, "call %d", i)
		msg := err.Error()
		require.True(t, strings.HasPrefix(msg, "pgquota: grant: "), "call %d: %q", i, msg)
		require.Equal(t, 1, strings.Count(msg, "pgquota: "), "call %d: %q", i, msg)
		if i%2 == 1 {
			require.NotErrorIs(t, err, quota.ErrOutcomeUnknown, "keyed call %d: its transaction never began: %q", i, msg)
		}
		t.Logf("call %d (outcome unknown %v): %s", i, errors.Is(err, quota.ErrOutcomeUnknown), msg)
	}
	direct, err := quota.New(pgtest.Connect(t, dbURL, 1), nil)
	require.NoError(t, err)
	u, err := direct.Usage(ctx, "q", "m")
	require.NoError(t, err)
	require.Zero(t, u.Used, "nothing was written")
}
