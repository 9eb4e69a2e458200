package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
)

// The two Redis servers the peers bench starts persist as their names say:
// the plain one not at all, the durable one with every write fsynced to
// its append-only file.
func TestStartRedisPersistsAsAsked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		durable                         bool
		appendonly, appendfsync, saving string
	}{
		{durable: false, appendonly: "no", saving: ""},
		{durable: true, appendonly: "yes", appendfsync: "always", saving: ""},
	} {
		srv, err := StartRedis(ctx, tc.durable)
		require.NoError(t, err, "redis-server must be installed (apt-get install redis-server)")
		t.Cleanup(srv.Stop)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		get := func(key string) string {
			v, err := rdb.ConfigGet(ctx, key).Result()
			require.NoError(t, err)
			return v[key]
		}
		require.Equal(t, tc.appendonly, get("appendonly"))
		require.Equal(t, tc.saving, get("save"))
		if tc.appendfsync != "" {
			require.Equal(t, tc.appendfsync, get("appendfsync"))
		}
		require.True(t, strings.HasPrefix(srv.Addr, "127.0.0.1:"))
		require.NotEmpty(t, srv.Version)
	}
}

// One short run of every case on every side completes operations without
// errors, the lease cycle's pgbench script included (its \gset and \if).
func TestPeersRunsEveryCaseOnEverySide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	rep, err := RunPeers(ctx, admin, PeersConfig{Clients: []int{2}, Duration: time.Second})
	require.NoError(t, err)
	require.Len(t, rep.Results, len(PeerCases())*len(PeerSides))
	for _, r := range rep.Results {
		require.Positive(t, r.OpsPerSec, "%s %s", r.Case, r.Side)
		require.Zero(t, r.Errors, "%s %s: %s", r.Case, r.Side, r.Note)
	}
	require.Positive(t, rep.Ratio("lease-cycle", "redis-aof", 2))
	path := t.TempDir() + "/peers.svg"
	require.NoError(t, WritePeersChart(rep, path))
}

// lease-cycle's pgbench script releases what it acquired: after one
// pgbench run no lease is left held.
func TestLeaseCycleScriptReleasesItsLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newScratch(t)
	script, base, err := leaseCycleScript(ctx, db)
	require.NoError(t, err)
	require.Contains(t, script.Text, `\gset`)
	pg, err := runPgbench(ctx, db, base, script, 2, time.Second, "", func(time.Duration) {})
	require.NoError(t, err)
	require.Positive(t, pg.Transactions)
	require.Zero(t, pg.Failed)
	pool, err := db.Pool(ctx, 1)
	require.NoError(t, err)
	defer pool.Close()
	var total, held int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE expires_at > clock_timestamp()) FROM pgquota.lease`).Scan(&total, &held))
	require.Greater(t, total, 10, "the script acquires many names, not one")
	require.Zero(t, held, "leases left held by the script")
}
