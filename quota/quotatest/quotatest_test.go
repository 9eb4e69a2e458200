package quotatest_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/quotatest"
)

// exists reports whether the test server has a database of that name.
func exists(t *testing.T, name string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv(quotatest.EnvURL))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var ok bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&ok))
	return ok
}

// A database is migrated to this build's latest version (CheckSchema
// passes, a grant works), separate from every other one, and dropped when
// its test ends.
func TestNewDatabaseIsMigratedSeparateAndDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var first, second *quotatest.Database
	t.Run("two databases", func(t *testing.T) {
		first = quotatest.NewDatabase(t, quotatest.WithMaxConns(2))
		second = quotatest.NewDatabase(t, quotatest.WithMaxConns(2))
		require.NotEqual(t, first.Name, second.Name)
		require.Regexp(t, `^pgquotatest_[0-9a-f]{16}$`, first.Name)
		require.EqualValues(t, 2, first.Pool.Config().MaxConns)

		var current string
		require.NoError(t, first.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&current))
		require.Equal(t, first.Name, current)
		conn, err := pgx.Connect(ctx, second.URL)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, `SELECT current_database()`).Scan(&current))
		require.NoError(t, conn.Close(ctx))
		require.Equal(t, second.Name, current, "URL names the database")

		for _, db := range []*quotatest.Database{first, second} {
			c, err := quota.New(db.Pool, nil)
			require.NoError(t, err)
			require.NoError(t, c.CheckSchema(ctx), "migrated to this build's latest version")
		}
		c, err := quota.New(first.Pool, nil)
		require.NoError(t, err)
		_, err = c.DefineQuota(ctx, quota.Definition{Name: "api", Window: quota.WindowDay, DefaultLimit: quota.Limit(1)})
		require.NoError(t, err)
		res, err := c.Grant(ctx, quota.GrantRequest{Quota: "api", Member: "m", Amount: 1})
		require.NoError(t, err)
		require.True(t, res.Granted)
		var n int
		require.NoError(t, second.Pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.quota`).Scan(&n))
		require.Zero(t, n, "the second database does not see the first's quota")
		require.True(t, exists(t, first.Name))
	})
	require.False(t, exists(t, first.Name), "dropped when its test ended")
	require.False(t, exists(t, second.Name), "dropped when its test ended")
}

// Many tests at once each get their own database (the template is built
// once, under its lock, whatever the number of callers).
func TestNewDatabaseConcurrently(t *testing.T) {
	t.Parallel()
	names := make(chan string, 8)
	t.Run("group", func(t *testing.T) {
		for i := range 8 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				db := quotatest.NewDatabase(t, quotatest.WithMaxConns(1))
				c, err := quota.New(db.Pool, nil)
				require.NoError(t, err)
				require.NoError(t, c.CheckSchema(context.Background()))
				names <- db.Name
			})
		}
	})
	close(names)
	seen := map[string]bool{}
	for n := range names {
		seen[n] = true
	}
	require.Len(t, seen, 8)
}

// fakeTB records how a helper ends the test: Fatalf or a skip (which it
// must never do). It stops the calling goroutine on both, as testing.T
// does.
type fakeTB struct {
	testing.TB
	mu      sync.Mutex
	fatal   string
	skipped bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any)                 { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) Skip(...any)                       { f.SkipNow() }
func (f *fakeTB) Skipf(string, ...any)              { f.SkipNow() }
func (f *fakeTB) SkipNow()                          { f.skipped = true; runtime.Goexit() }
func (f *fakeTB) Cleanup(func())                    {}
func (f *fakeTB) Errorf(format string, args ...any) { f.Fatalf(format, args...) }

// run calls NewDatabase with f and returns once it has returned or ended
// the (fake) test.
func (f *fakeTB) run(opts ...quotatest.Option) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		quotatest.NewDatabase(f, opts...)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		panic("NewDatabase did not return")
	}
}

// Without a server URL, with a malformed one or an unreachable server, the
// test fails with a message saying what to set; it is never skipped.
func TestNewDatabaseFailsClearlyWithoutAServer(t *testing.T) {
	t.Setenv(quotatest.EnvURL, "")
	f := &fakeTB{}
	f.run()
	require.False(t, f.skipped, "never skips")
	require.Contains(t, f.fatal, "PGQUOTA_TEST_DATABASE_URL is not set")
	require.Contains(t, f.fatal, "export PGQUOTA_TEST_DATABASE_URL=")

	f = &fakeTB{}
	f.run(quotatest.WithURL("host=localhost dbname=x"))
	require.False(t, f.skipped)
	require.Contains(t, f.fatal, "must be a postgres:// URL")

	f = &fakeTB{}
	f.run(quotatest.WithURL("postgres://postgres:secret@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5"))
	require.False(t, f.skipped)
	require.Contains(t, f.fatal, "cannot connect to the test server postgres://postgres:xxxxx@127.0.0.1:1/postgres")
	require.NotContains(t, f.fatal, "secret", "the password is not printed")
}
