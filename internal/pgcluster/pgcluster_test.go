package pgcluster_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgcluster"
)

// TestStandbyCutOffMissesCommitsAndPromotesToANewTimeline proves what the
// failover tests rely on: a standby made with NewStandby has what its
// primary wrote before; after CutOff it misses the primary's later commits,
// also across the primary's immediate shutdown and its own promotion; the
// promoted standby writes on timeline 2 at once; and the old primary
// restarts after a crash with every synchronous commit.
func TestStandbyCutOffMissesCommitsAndPromotesToANewTimeline(t *testing.T) {
	t.Parallel()
	p := pgcluster.New(t, "primary", nil)
	p.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
	s := p.NewStandby("standby")
	var n int
	s.QueryValue("postgres", "SELECT count(*)::int FROM t", &n)
	require.Equal(t, 1, n)

	s.CutOff()
	p.Exec("postgres", "INSERT INTO t VALUES (2)")
	p.Crash()
	s.Promote()
	s.QueryValue("postgres", "SELECT count(*)::int FROM t", &n)
	require.Equal(t, 1, n, "the standby missed the commit made after CutOff")
	s.Exec("postgres", "INSERT INTO t VALUES (3)")
	var timeline int64
	s.QueryValue("postgres", "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint", &timeline)
	require.Equal(t, int64(2), timeline)

	p.Start()
	p.QueryValue("postgres", "SELECT count(*)::int FROM t", &n)
	require.Equal(t, 2, n, "the old primary kept its synchronous commit across the crash")
}

// TestPausedStandbyReplaysReceivedWALWhenPromoted documents why CutOff,
// not PauseReplay, makes a standby miss commits: WAL received while replay
// is paused is replayed when the standby is promoted.
func TestPausedStandbyReplaysReceivedWALWhenPromoted(t *testing.T) {
	t.Parallel()
	p := pgcluster.New(t, "primary", nil)
	p.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
	s := p.NewStandby("standby")
	s.PauseReplay()
	p.Exec("postgres", "INSERT INTO t VALUES (2)")
	var n int
	s.QueryValue("postgres", "SELECT count(*)::int FROM t", &n)
	require.Equal(t, 1, n, "replay is paused")
	p.Stop() // a clean shutdown: the standby receives everything first
	s.Promote()
	s.QueryValue("postgres", "SELECT count(*)::int FROM t", &n)
	require.Equal(t, 2, n)
}
