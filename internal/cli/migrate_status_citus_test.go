//go:build citus

// This test starts a Citus coordinator and a worker (internal/cituscluster,
// which needs citus.so): it builds with -tags citus, in CI's Citus pass.

package cli_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
)

// On Citus, `migrate up` distributes pgquota's tables and `migrate status`
// lists, after the migrations, how each one is distributed, while its JSON
// stays the list of migrations; `migrate tables --json` gives the
// distribution. On plain PostgreSQL the status has no table list and
// `migrate tables --json` is [].
func TestMigrateStatusShowsCitusDistribution(t *testing.T) {
	c := cituscluster.Start(t, 1)
	dbURL := c.URL()
	up := ok(t, dbURL, "migrate", "up")
	require.Regexp(t, `(?m)^citus +23 tables distributed or reference, the rest on the coordinator`, up,
		"migrate up says it distributed the tables")
	again := okJSON(t, dbURL, cli.ExitOK, "migrate", "up").(map[string]any)
	require.Equal(t, 23.0, again["citus_tables"])

	out := ok(t, dbURL, "migrate", "status")
	t.Logf("migrate status:\n%s", out)
	files, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	head, tables, found := strings.Cut(out, "\n\n")
	require.True(t, found, "a blank line before the table list: %q", out)
	require.Len(t, strings.Split(strings.TrimSuffix(head, "\n"), "\n"), len(files)+1, "a header and a line per migration")
	lines := strings.Split(strings.TrimSuffix(tables, "\n"), "\n")
	require.Regexp(t, `^TABLE +CITUS$`, lines[0])
	require.Len(t, lines, 27, "a header and pgquota's 26 tables")
	for _, want := range []string{
		`pgquota.quota +reference`,
		`pgquota.ledger +reference`,
		`pgquota.usage +distributed by member`,
		`pgquota.rate_state +distributed by member colocated with usage`,
		`pgquota.lease +distributed by name`,
		`pgquota.fence +distributed by resource colocated with lease`,
		`pgquota.voucher_code +distributed by campaign colocated with voucher_pool`,
		`pgquota.outbox_claimed +local`,
		`pgquota.pgquota_migrations +local`,
	} {
		require.Regexp(t, regexp.MustCompile(`(?m)^`+want+`$`), tables)
	}

	require.Len(t, okJSON(t, dbURL, cli.ExitOK, "migrate", "status").([]any), len(files))
	byName := map[string]map[string]any{}
	for _, x := range okJSON(t, dbURL, cli.ExitOK, "migrate", "tables").([]any) {
		m := x.(map[string]any)
		byName[m["table"].(string)] = m
	}
	require.Len(t, byName, 26)
	require.Equal(t, map[string]any{"table": "usage", "method": "distributed", "column": "member", "colocated_with": nil, "shards": 32.0}, byName["usage"])
	require.Equal(t, map[string]any{"table": "counter_lock", "method": "distributed", "column": "member", "colocated_with": "usage", "shards": 32.0}, byName["counter_lock"])
	require.Equal(t, map[string]any{"table": "quota", "method": "reference", "column": nil, "colocated_with": nil, "shards": 1.0}, byName["quota"])
	require.Equal(t, map[string]any{"table": "pgquota_migrations", "method": "local", "column": nil, "colocated_with": nil, "shards": 0.0}, byName["pgquota_migrations"])

	plain := pgtest.NewURL(t)
	out = ok(t, plain, "migrate", "status")
	require.NotContains(t, out, "CITUS")
	require.NotContains(t, out, "\n\n")
	_ = okJSON(t, plain, cli.ExitOK, "migrate", "status").([]any)
	require.Empty(t, okJSON(t, plain, cli.ExitOK, "migrate", "tables").([]any))
	require.Contains(t, ok(t, plain, "migrate", "tables"), "no citus extension")
}
