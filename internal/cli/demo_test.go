package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// `pgquota demo` on a server with no database of its own: the first run
// creates and migrates its database, and 20 concurrent grants from two
// clients against a limit of 5 grant exactly 5; a second run reuses the
// database (created false) with a new member, again exactly 5. The
// database then holds one counter per member at 5, and nothing else.
func TestDemoCreatesItsDatabaseAndTheLimitHolds(t *testing.T) {
	t.Parallel()
	base := pgtest.BaseURL(t)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "pgquota_demo_test_" + hex.EncodeToString(suffix)
	ctx := context.Background()
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})

	type demoJSON struct {
		Database string `json:"database"`
		Created  bool   `json:"created"`
		Member   string `json:"member"`
		Attempts int    `json:"attempts"`
		Granted  int    `json:"granted"`
		Denied   int    `json:"denied"`
		Used     int64  `json:"used"`
	}
	members := map[string]bool{}
	for i, wantCreated := range []bool{true, false} {
		r := run(t, "--database-url", base, "--json", "demo", "--demo-database", name)
		require.Equal(t, cli.ExitOK, r.code, "run %d: stderr %q", i, r.stderr)
		var got demoJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
		require.Equal(t, demoJSON{Database: name, Created: wantCreated, Member: got.Member, Attempts: 20, Granted: 5, Denied: 15, Used: 5}, got)
		members[got.Member] = true
	}
	require.Len(t, members, 2, "each run races for a new member")

	cfg, err := pgx.ParseConfig(base)
	require.NoError(t, err)
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT member, used FROM pgquota.usage WHERE quota_name = 'demo-api-calls'`)
	require.NoError(t, err)
	counters, err := pgx.CollectRows(rows, pgx.RowToMap)
	require.NoError(t, err)
	require.Len(t, counters, 2)
	for _, c := range counters {
		require.True(t, members[c["member"].(string)])
		require.Equal(t, int64(5), c["used"])
	}

	// Text output ends with how to go on, naming the demo's database.
	r := run(t, "--database-url", base, "demo", "--demo-database", name)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "granted            5")
	require.Contains(t, r.stdout, "export DATABASE_URL=")
	require.Contains(t, r.stdout, "/"+name)
	require.Contains(t, r.stdout, "dropdb")
}
