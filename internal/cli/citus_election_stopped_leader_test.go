//go:build citus

package cli_test

import (
	"testing"

	"github.com/pgquota/pgquota/internal/cituscluster"
)

// On a Citus coordinator with two workers, a `pgquota election campaign`
// leader whose process is stopped (SIGSTOP) past its 1 s TTL is deposed:
// another campaigner takes over with a higher token, the stopped
// leader's fenced write is refused as stale, and once continued (SIGCONT)
// it learns it lost and exits 3, leaving the new leader's lease alone.
func TestCitusElectionStoppedLeaderIsDeposed(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	requireStoppedLeaderIsDeposed(t, c.URL())
}
