package cli

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Without --database-url, DATABASE_URL or PG* variables, pgx falls back on
// libpq's defaults (the local socket, the OS user, the database named
// like it), and the words say so. (No t.Parallel: t.Setenv.)
func TestSettingsSourceDefaults(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, v := range locationVars {
		t.Setenv(v, "")
	}
	dsn, name, settings := settingsSource("")
	require.Empty(t, dsn)
	require.Equal(t, "the PG* environment variables", name)
	require.Equal(t, "libpq defaults: no --database-url, DATABASE_URL or PG* variables", settings)

	tg := newTarget(&pgconn.Config{Host: "/var/run/postgresql", Port: 5432, User: "root"}, settings)
	require.Equal(t, `database "root" on /var/run/postgresql as user root (libpq defaults: no --database-url, DATABASE_URL or PG* variables)`, tg.String())
	tg = newTarget(&pgconn.Config{Host: "/tmp", Port: 5433, User: "u", Database: "d", Password: "s3cret"}, settings)
	require.Equal(t, `database "d" on /tmp port 5433 as user u (libpq defaults: no --database-url, DATABASE_URL or PG* variables)`, tg.String())
	tg = newTarget(&pgconn.Config{Host: "::1", Port: 5432, User: "u", Database: "d"}, "from --database-url")
	require.Equal(t, `database "d" on [::1]:5432 as user u (from --database-url)`, tg.String())

	t.Setenv("PGUSER", "bob")
	_, _, settings = settingsSource("")
	require.Equal(t, "from PGUSER, libpq defaults for the rest", settings)
	t.Setenv("DATABASE_URL", "postgres:///x")
	dsn, name, settings = settingsSource("")
	require.Equal(t, "postgres:///x", dsn)
	require.Equal(t, "DATABASE_URL", name)
	require.Equal(t, "from DATABASE_URL", settings)
	dsn, name, settings = settingsSource("postgres:///y")
	require.Equal(t, "postgres:///y", dsn)
	require.Equal(t, "--database-url", name)
	require.Equal(t, "from --database-url", settings)
}
