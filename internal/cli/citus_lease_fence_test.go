//go:build citus

package cli_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
)

// On a Citus coordinator with two workers, after `migrate up`: of 20
// concurrent acquires of one lease exactly one is taken; its token fences
// writes; once the lease expires a new holder gets a higher token and the
// old holder's write, renew and release are refused; a renew after the
// wait for the row decides on the time it got the row.
func TestCitusLeaseAcquireFencesAndRefusesStaleToken(t *testing.T) {
	c := cituscluster.Start(t, 2)
	db := c.URL()
	ok(t, db, "migrate", "up")

	var mu sync.Mutex
	codes := map[int]int{}
	var tokens []int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := runDB(t, db, "--json", "lease", "acquire", "--name", "report", "--holder", fmt.Sprintf("h%d", i), "--ttl", "2s")
			mu.Lock()
			defer mu.Unlock()
			codes[r.code]++
			if r.code == cli.ExitOK {
				var l struct {
					Token    int64 `json:"token"`
					Acquired bool  `json:"acquired"`
				}
				if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || !l.Acquired {
					t.Errorf("acquire %d: %q (%v)", i, r.stdout, err)
				}
				tokens = append(tokens, l.Token)
			} else if r.code != cli.ExitDenied {
				t.Errorf("acquire %d: exit %d, stderr %q", i, r.code, r.stderr)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, map[int]int{cli.ExitOK: 1, cli.ExitDenied: 19}, codes)
	first := strconv.FormatInt(tokens[0], 10)

	ok(t, db, "fence", "write", "--resource", "report", "--lease", "report", "--key", "status", "--token", first, "--value", "v1")
	ok(t, db, "lease", "renew", "--name", "report", "--token", first, "--ttl", "1s")
	time.Sleep(1100 * time.Millisecond)

	second := acquireJSON(t, db, "--name", "report", "--holder", "next", "--ttl", "30s")
	require.Greater(t, second, tokens[0], "the next holder's token is higher")
	ok(t, db, "fence", "write", "--resource", "report", "--lease", "report", "--key", "status", "--token", strconv.FormatInt(second, 10), "--value", "v2")

	r := runDB(t, db, "fence", "write", "--resource", "report", "--key", "status", "--token", first, "--value", "stale")
	requireError(t, r, cli.ExitDenied, "stale fencing token "+first)
	requireError(t, runDB(t, db, "lease", "renew", "--name", "report", "--token", first, "--ttl", "10s"), cli.ExitDenied, "lease lost")
	requireError(t, runDB(t, db, "lease", "release", "--name", "report", "--token", first), cli.ExitDenied, "lease lost")
	var value string
	var token int64
	require.NoError(t, c.Pool().QueryRow(t.Context(),
		`SELECT value, fence_token FROM pgquota.fenced_row WHERE resource = 'report' AND key = 'status'`).Scan(&value, &token))
	require.Equal(t, "v2", value)
	require.Equal(t, second, token)

	// The holder's own release, then a taker: a still higher token.
	ok(t, db, "lease", "release", "--name", "report", "--token", strconv.FormatInt(second, 10))
	third := acquireJSON(t, db, "--name", "report", "--holder", "last", "--ttl", "30s")
	require.Greater(t, third, second)

	// A renew that waits for the lease's row (an application transaction
	// holds it) decides on the clock when it gets the row: the lease
	// expires 1 s after the wait, not 1 s after the call.
	tx, err := c.Pool().Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM pgquota.lease WHERE name = 'report' FOR UPDATE`)
	require.NoError(t, err)
	done := make(chan result, 1)
	go func() {
		done <- runDB(t, db, "--json", "lease", "renew", "--name", "report", "--token", strconv.FormatInt(third, 10), "--ttl", "1s")
	}()
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, tx.Commit(t.Context()))
	rr := <-done
	require.Equal(t, cli.ExitOK, rr.code, rr.stderr)
	var renewed struct {
		ExpiresAt time.Time `json:"expires_at"`
		DBNow     time.Time `json:"db_now"`
	}
	require.NoError(t, json.Unmarshal([]byte(rr.stdout), &renewed), rr.stdout)
	require.Equal(t, time.Second, renewed.ExpiresAt.Sub(renewed.DBNow))

	// A waiter registers (AcquireWait does, once it LISTENs) and the
	// release of the lease notifies it: lease_wait_register has a Citus
	// body (the clock in a variable, not in the DELETE's WHERE).
	var waited int64
	require.NoError(t, c.Pool().QueryRow(t.Context(),
		`SELECT token FROM pgquota.lease_acquire('1 minute', 'waited', 'h', 'a')`).Scan(&waited))
	var until time.Time
	require.NoError(t, c.Pool().QueryRow(t.Context(),
		`SELECT pgquota.lease_wait_register('waited', 'w1', '10 seconds')`).Scan(&until))
	var notified bool
	require.NoError(t, c.Pool().QueryRow(t.Context(),
		`SELECT notified FROM pgquota.lease_release('waited', $1)`, waited).Scan(&notified))
	require.True(t, notified, "the release notified the registered waiter")
}
