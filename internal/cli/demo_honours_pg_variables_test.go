package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// With neither --database-url nor DATABASE_URL, the demo's default server
// takes PGHOST, PGPORT and PGUSER where they are set, as every other
// command does: on a server off port 5432 the demo runs there, not on 5432.
func TestDemoHonoursPGVariables(t *testing.T) {
	base := pgtest.BaseURL(t)
	cfg, err := pgx.ParseConfig(base)
	require.NoError(t, err)
	t.Setenv("DATABASE_URL", "")
	t.Setenv("PGSERVICE", "")
	t.Setenv("PGDATABASE", "")
	t.Setenv("PGHOST", cfg.Host)
	t.Setenv("PGPORT", strconv.Itoa(int(cfg.Port)))
	t.Setenv("PGUSER", cfg.User)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "pgquota_demo_env_" + hex.EncodeToString(suffix)
	ctx := context.Background()
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})

	r := run(t, "--json", "demo", "--demo-database", name)
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	var got struct {
		URL     string `json:"url"`
		Created bool   `json:"created"`
		Granted int    `json:"granted"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.True(t, got.Created)
	require.Equal(t, 5, got.Granted)
	// The test server's host is an address (127.0.0.1), the default's is
	// "localhost": the URL names the variables' host and port.
	require.NotEqual(t, "localhost", cfg.Host, "the test server must be named by address for this test")
	require.Contains(t, got.URL, "@"+cfg.Host+":"+strconv.Itoa(int(cfg.Port))+"/"+name)
}
