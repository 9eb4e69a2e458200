//go:build citus

package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
)

// On a Citus coordinator with two workers, after `migrate up`: 20
// concurrent claims of every campaign kind against 5 vouchers give exactly
// 5, a keyed claim replays its first outcome, an external fenced write with
// a stale token is refused, and the outbox (kept on the coordinator) is
// enqueued and relayed.
func TestCitusVoucherClaimsFencesAndOutboxAreExact(t *testing.T) {
	c := cituscluster.Start(t, 2)
	db := c.URL()
	ok(t, db, "migrate", "up")

	codes := filepath.Join(t.TempDir(), "codes.txt")
	require.NoError(t, os.WriteFile(codes, []byte("A\nB\nC\nD\nE\n"), 0o600))
	ok(t, db, "voucher", "create", "--campaign", "counted", "--total", "5")
	ok(t, db, "voucher", "create", "--campaign", "sharded", "--total", "5", "--shards", "4")
	ok(t, db, "voucher", "import", "--campaign", "codes", "--file", codes)

	for _, campaign := range []string{"counted", "sharded", "codes"} {
		t.Run(campaign, func(t *testing.T) {
			var mu sync.Mutex
			codesOf := map[int]int{}
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := runDB(t, db, "--json", "voucher", "claim", "--campaign", campaign, "--member", fmt.Sprintf("m%d", i))
					mu.Lock()
					codesOf[r.code]++
					mu.Unlock()
					if r.code != cli.ExitOK && r.code != cli.ExitDenied {
						t.Errorf("claim %d: exit %d, stderr %q", i, r.code, r.stderr)
					}
				}()
			}
			wg.Wait()
			require.Equal(t, map[int]int{cli.ExitOK: 5, cli.ExitDenied: 15}, codesOf)
			st := okJSON(t, db, cli.ExitOK, "voucher", "status", "--campaign", campaign).(map[string]any)
			require.Equal(t, 5.0, st["claimed"])
			require.Equal(t, 0.0, st["remaining"])
			require.Equal(t, true, st["sold_out"])
		})
	}

	// A keyed claim: the repeat prints the first outcome and claims nothing.
	ok(t, db, "voucher", "create", "--campaign", "keyed", "--total", "2")
	first := okJSON(t, db, cli.ExitOK, "voucher", "claim", "--campaign", "keyed", "--member", "k", "--idempotency-key", "order-1").(map[string]any)
	again := okJSON(t, db, cli.ExitOK, "voucher", "claim", "--campaign", "keyed", "--member", "k", "--idempotency-key", "order-1").(map[string]any)
	require.Equal(t, false, first["replayed"])
	require.Equal(t, true, again["replayed"])
	require.Equal(t, first["seq"], again["seq"])
	st := okJSON(t, db, cli.ExitOK, "voucher", "status", "--campaign", "keyed").(map[string]any)
	require.Equal(t, 1.0, st["claimed"])

	// An external fence: a lower token than the highest seen is refused
	// and changes nothing.
	ok(t, db, "fence", "write", "--resource", "orders", "--key", "o-1", "--token", "10", "--value", "paid", "--external")
	r := runDB(t, db, "fence", "write", "--resource", "orders", "--key", "o-1", "--token", "9", "--value", "stale", "--external")
	requireError(t, r, cli.ExitDenied, "stale fencing token 9", "highest token seen is 10")
	var value string
	require.NoError(t, c.Pool().QueryRow(t.Context(), `SELECT value FROM pgquota.fenced_row WHERE resource = 'orders' AND key = 'o-1'`).Scan(&value))
	require.Equal(t, "paid", value)

	// The outbox stays on the coordinator: enqueue, then one relay pass.
	ok(t, db, "outbox", "enqueue", "--topic", "t", "--payload", `{"n":1}`)
	r = runDB(t, db, "outbox", "relay", "--once")
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	require.Equal(t, 1, strings.Count(r.stdout, "\n"), "one event delivered: %q", r.stdout)
	require.Contains(t, r.stdout, `"payload":{"n":1}`)
	require.Contains(t, r.stderr, "delivered 1, failed 0, dead 0")
	stat := okJSON(t, db, cli.ExitOK, "outbox", "status").(map[string]any)
	require.Equal(t, 1.0, stat["delivered"])
	require.Equal(t, 0.0, stat["pending"])
}
