package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/lab"
)

// TestLabLockServiceUnavailableSaysWhy: when a lock service's server cannot
// start (here: PGQUOTA_ETCD and PGQUOTA_ZOOKEEPER_JAR name files that do not
// exist), `pgquota lab --json` reports its strategies unavailable with the
// reason and what to install, and the run still succeeds for the others.
func TestLabLockServiceUnavailableSaysWhy(t *testing.T) {
	t.Setenv("PGQUOTA_ETCD", "/nonexistent/etcd")
	t.Setenv("PGQUOTA_ZOOKEEPER_JAR", "/nonexistent/zookeeper.jar")
	out, errs, code := runOut(t, "lab", "--json", "--requests", "3",
		"--strategy", "conditional,zookeeper,zookeeper-fenced,etcd,etcd-fenced")
	require.Equal(t, cli.ExitOK, code, errs)
	var rep lab.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Empty(t, rep.Violations)
	got := map[string]lab.StrategyReport{}
	for _, s := range rep.Strategies {
		got[s.Name] = s
	}
	require.Equal(t, lab.StatusOK, got["conditional"].Status)
	for _, name := range []string{"zookeeper", "zookeeper-fenced"} {
		require.Equal(t, lab.StatusUnavailable, got[name].Status, name)
		require.Contains(t, got[name].Reason, "ZooKeeper did not start: zookeeper is not installed: no /nonexistent/zookeeper.jar: install Debian's zookeeper package", name)
	}
	for _, name := range []string{"etcd", "etcd-fenced"} {
		require.Equal(t, lab.StatusUnavailable, got[name].Status, name)
		require.Contains(t, got[name].Reason, "etcd did not start: etcd is not installed: PGQUOTA_ETCD=/nonexistent/etcd", name)
		require.Contains(t, got[name].Reason, "install Debian's etcd-server package", name)
	}
}
