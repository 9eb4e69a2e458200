package cli_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// migrate down on a schema a newer build migrated names it as up and status
// do (newer than this build, upgrade pgquota, --to the newest this build
// knows), where it said goose's "version not found", and rolls back nothing.
func TestMigrateDownOnNewerSchemaSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	unknown := migrations.Latest() + 1
	_, err := pgtest.ConnectOwner(t, dbURL, 1).Exec(ctx, `INSERT INTO `+migrations.VersionTable+` (version_id, is_applied) VALUES ($1, true)`, unknown)
	require.NoError(t, err)

	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "status"}, {"migrate", "down"}, {"migrate", "down", "--to", "2"}} {
		r := runDB(t, dbURL, args...)
		requireError(t, r, cli.ExitError, "newer than this build", "upgrade pgquota", strconv.FormatInt(unknown, 10),
			"migrate down --to "+strconv.FormatInt(migrations.Latest(), 10))
		require.NotContains(t, r.stderr, "not found", "%v", args)
	}
	var applied int
	require.NoError(t, pgtest.ConnectOwner(t, dbURL, 1).QueryRow(ctx,
		`SELECT count(*) FROM `+migrations.VersionTable+` WHERE version_id > 0 AND is_applied`).Scan(&applied))
	require.Equal(t, len(mustSources(t))+1, applied, "nothing rolled back")
}

func mustSources(t *testing.T) []string {
	t.Helper()
	entries, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
