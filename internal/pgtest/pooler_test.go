package pgtest_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
)

// Under PGQUOTA_TEST_POOLER=pgbouncer, NewPool's pools reach the test's
// database through PgBouncer (another port), in pgx's exec mode, and
// transactions of one client land on the server connections PgBouncer
// chooses; the database itself is the one NewURL made.
func TestPoolURLGoesThroughPgBouncer(t *testing.T) {
	t.Setenv(pgtest.EnvPooler, "pgbouncer")
	ctx := context.Background()
	direct := pgtest.NewURL(t)
	pooled := pgtest.PoolURL(t, direct)
	du, err := url.Parse(direct)
	require.NoError(t, err)
	pu, err := url.Parse(pooled)
	require.NoError(t, err)
	require.NotEqual(t, du.Port(), pu.Port())
	require.Equal(t, du.Path, pu.Path)
	require.Equal(t, "exec", pu.Query().Get("default_query_exec_mode"))

	pool := pgtest.Connect(t, pooled, 2)
	require.Equal(t, pgx.QueryExecModeExec, pool.Config().ConnConfig.DefaultQueryExecMode)
	var db string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	require.Equal(t, du.Path[1:], db)

	// Only PgBouncer's admin console answers SHOW POOLS with pool_mode.
	admin, err := url.Parse(pooled)
	require.NoError(t, err)
	admin.Path = "/pgbouncer"
	admin.User = url.User(pgtestBaseUser(t))
	q := admin.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	admin.RawQuery = q.Encode()
	conn, err := pgx.Connect(ctx, admin.String())
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW POOLS")
	require.NoError(t, err)
	modes := map[string]string{}
	for rows.Next() {
		vals := rows.RawValues()
		var name, mode string
		for i, fd := range rows.FieldDescriptions() {
			switch fd.Name {
			case "database":
				name = string(vals[i])
			case "pool_mode":
				mode = string(vals[i])
			}
		}
		modes[name] = mode
	}
	require.NoError(t, rows.Err())
	require.Equal(t, "transaction", modes[db])

	t.Setenv(pgtest.EnvPooler, "")
	require.Equal(t, direct, pgtest.PoolURL(t, direct), "without the variable, URLs stay direct")
}

func pgtestBaseUser(t *testing.T) string {
	u, err := url.Parse(pgtest.BaseURL(t))
	require.NoError(t, err)
	return u.User.Username()
}
