package fence_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pgquota.present_token checks its arguments as the other SQL functions do
// (22023): a NULL, empty, over-255-byte or control-character resource or
// lease, and a token below 1, before it looks anything up; the message
// names the parameter and never echoes the value.
func TestPresentTokenChecksArguments(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	huge := strings.Repeat("r", 10<<20)
	for _, c := range []struct {
		name, resource, leaseName string
		nullResource              bool
		token                     int64
		param                     string
	}{
		{name: "10 MB resource", resource: huge, token: 1, param: "p_resource"},
		{name: "256-byte resource", resource: strings.Repeat("r", 256), token: 1, param: "p_resource"},
		{name: "empty resource", resource: "", token: 1, param: "p_resource"},
		{name: "NULL resource", nullResource: true, token: 1, param: "p_resource"},
		{name: "control character", resource: "r\x01eport", token: 1, param: "p_resource"},
		{name: "newline", resource: "r\neport", token: 1, param: "p_resource"},
		{name: "10 MB lease", resource: "r", leaseName: huge, token: 1, param: "p_lease"},
		{name: "control character lease", resource: "r", leaseName: "l\x7f", token: 1, param: "p_lease"},
		{name: "token 0", resource: "r", token: 0, param: "p_token"},
	} {
		var resource, leaseName any = c.resource, c.leaseName
		if c.nullResource {
			resource = nil
		}
		if c.leaseName == "" {
			leaseName = nil
		}
		_, err := b.pool.Exec(b.ctx, `SELECT pgquota.present_token($1, $2, $3)`, resource, c.token, leaseName)
		pgErr := requireSQLState(t, err, "22023", c.name)
		require.Contains(t, pgErr.Message, c.param, c.name)
		require.Less(t, len(pgErr.Message), 200, "%s: the message does not echo the value: %.300s", c.name, pgErr.Message)
		require.NotContains(t, pgErr.Message, "rrrrrrrrrr", c.name)
	}
	require.Zero(t, b.countRows(t, "fence"), "nothing written")
}
