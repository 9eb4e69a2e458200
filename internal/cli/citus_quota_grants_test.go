//go:build citus

package cli_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
)

// On a Citus coordinator with two workers, after `migrate up`: quotas of
// every kind are defined from the shell, and 20 concurrent `pgquota grant`
// against a limit of 5 give exactly 5, for one member and for a member with
// its own limit; a keyed grant replays; a redefinition of kind with
// --replace-kind deletes the counters.
func TestCitusQuotaDefineAndConcurrentGrantsAreExact(t *testing.T) {
	c := cituscluster.Start(t, 2)
	db := c.URL()
	ok(t, db, "migrate", "up")

	defs := map[string][]string{
		"day":     {"--window", "day", "--tz", "Europe/Berlin", "--limit", "5"},
		"none":    {"--window", "none", "--limit", "5"},
		"fixed":   {"--window", "1h", "--limit", "5"},
		"rolling": {"--rolling", "1h", "--limit", "5"},
		"rate":    {"--rate", "5/1h", "--burst", "5"},
	}
	for name, args := range defs {
		ok(t, db, append([]string{"quota", "define", "--name", name}, args...)...)
	}
	race := func(t *testing.T, args ...string) map[int]int {
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := runDB(t, db, append([]string{"grant"}, args...)...)
				mu.Lock()
				codes[r.code]++
				mu.Unlock()
				if r.code != cli.ExitOK && r.code != cli.ExitDenied {
					t.Errorf("grant %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
				}
			}()
		}
		wg.Wait()
		return codes
	}
	for name := range defs {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, map[int]int{cli.ExitOK: 5, cli.ExitDenied: 15}, race(t, "--quota", name, "--member", "hot"))
			u := okJSON(t, db, cli.ExitOK, "usage", "--quota", name, "--member", "hot").(map[string]any)
			require.Equal(t, 5.0, u["used"], "%v", u)
		})
	}

	ok(t, db, "quota", "set-limit", "--name", "day", "--member", "small", "--limit", "2")
	require.Equal(t, map[int]int{cli.ExitOK: 2, cli.ExitDenied: 18}, race(t, "--quota", "day", "--member", "small"))
	require.Equal(t, map[int]int{cli.ExitOK: 5, cli.ExitDenied: 15}, race(t, "--quota", "rate", "--quota", "none", "--member", "both"))

	first := okJSON(t, db, cli.ExitOK, "grant", "--quota", "none", "--member", "k", "--amount", "3", "--idempotency-key", "order-1").(map[string]any)
	again := okJSON(t, db, cli.ExitOK, "grant", "--quota", "none", "--member", "k", "--amount", "3", "--idempotency-key", "order-1").(map[string]any)
	require.Equal(t, first["grant_id"], again["grant_id"])
	require.Equal(t, true, again["replayed"])
	u := okJSON(t, db, cli.ExitOK, "usage", "--quota", "none", "--member", "k").(map[string]any)
	require.Equal(t, 3.0, u["used"])

	r := runDB(t, db, "quota", "define", "--name", "day", "--window", "hour", "--limit", "5")
	requireError(t, r, cli.ExitUsage, "changes the quota's kind", "nothing was changed")
	ok(t, db, "quota", "define", "--name", "day", "--window", "hour", "--limit", "5", "--replace-kind")
	var rows int
	require.NoError(t, c.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pgquota.usage WHERE quota_name = 'day'`).Scan(&rows))
	require.Zero(t, rows, "the day counters are gone")
	require.Equal(t, map[int]int{cli.ExitOK: 5, cli.ExitDenied: 15}, race(t, "--quota", "day", "--member", "hot"))
	ok(t, db, "quota", "define", "--name", "none", "--rolling", "1h", "--limit", "5", "--replace-kind")
	require.NoError(t, c.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pgquota.usage WHERE quota_name = 'none'`).Scan(&rows))
	require.Zero(t, rows, "the lifetime counters are gone")
	require.Equal(t, map[int]int{cli.ExitOK: 5, cli.ExitDenied: 15}, race(t, "--quota", "none", "--member", "hot"))
}
