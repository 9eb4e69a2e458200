package lease_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// pgquota.lease_acquire and pgquota.lease_renew, called from SQL, refuse
// what the Go library refuses before sending (a TTL outside 1 ms to 24 h,
// a NULL, empty, overlong or control-character name, holder or attempt)
// with 22023 naming the parameter, and write nothing: no lease row, no
// renewal that leaves the lease expired.
func TestLeaseSQLFunctionsCheckArguments(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	cases := []struct {
		name, sql, param string
		args             []any
	}{
		{"negative ttl", `SELECT * FROM pgquota.lease_acquire('-1 hour', 'n1', 'h', 'a')`, "p_ttl", nil},
		{"ttl above a day", `SELECT * FROM pgquota.lease_acquire('100 years', 'n1', 'h', 'a')`, "p_ttl", nil},
		{"null ttl", `SELECT * FROM pgquota.lease_acquire(NULL, 'n1', 'h', 'a')`, "p_ttl", nil},
		{"null name", `SELECT * FROM pgquota.lease_acquire('1 hour', NULL, 'h', 'a')`, "p_name", nil},
		{"control character in name", `SELECT * FROM pgquota.lease_acquire('1 hour', E'bad\x01lease', 'h', 'a')`, "p_name", nil},
		{"overlong name", `SELECT * FROM pgquota.lease_acquire('1 hour', repeat('x', 256), 'h', 'a')`, "p_name", nil},
		{"empty holder", `SELECT * FROM pgquota.lease_acquire('1 hour', 'n1', '', 'a')`, "p_holder", nil},
		{"null attempt", `SELECT * FROM pgquota.lease_acquire('1 hour', 'n1', 'h', NULL)`, "p_attempt", nil},
	}
	for _, c := range cases {
		_, err := b.app.Exec(ctx, c.sql, c.args...)
		require.Error(t, err, c.name)
		require.Equal(t, "22023", pgCode(err), "%s: %v", c.name, err)
		require.Contains(t, err.Error(), c.param, c.name)
	}
	var n int
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT count(*) FROM pgquota.lease`).Scan(&n))
	require.Zero(t, n, "nothing written")

	var token int64
	require.NoError(t, b.app.QueryRow(ctx, `SELECT token FROM pgquota.lease_acquire('1 hour', 'n2', 'h', 'a')`).Scan(&token))
	_, err := b.app.Exec(ctx, `SELECT * FROM pgquota.lease_renew('n2', $1, '-1 hour')`, token)
	require.Error(t, err)
	require.Equal(t, "22023", pgCode(err), "%v", err)
	var held bool
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgquota.lease WHERE name = 'n2'`).Scan(&held))
	require.True(t, held, "a refused renewal leaves the lease as it was")
}
