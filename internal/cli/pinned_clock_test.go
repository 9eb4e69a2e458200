package cli_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// pinClock pins pgquota.clock() in the database at dbURL to the instant
// at (RFC 3339), so that every grant and usage the test runs happens at
// that one instant of the database's clock: the waits the CLI prints are
// then exact, however long the machine takes between two commands.
func pinClock(t *testing.T, dbURL, at string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT '`+at+`'::timestamptz $$`)
	require.NoError(t, err)
}
