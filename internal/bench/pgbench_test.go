package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A pgbench run that completed no transaction (an overloaded machine: the
// connections took the whole run) is not an error, and its note says what
// happened and what to try.
func TestRunPgbenchNoTransaction(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fake := filepath.Join(dir, "pgbench")
	require.NoError(t, os.WriteFile(fake, []byte(`#!/bin/sh
cat <<'OUT'
number of transactions actually processed: 0
initial connection time = 4987.123 ms
tps = 0.000000 (without initial connection time)
OUT
`), 0o755))
	res, err := RunPgbench(context.Background(), &Script{Strategy: "grant-hot", Text: "SELECT 1;\n"}, PgbenchOptions{
		Path: fake, Clients: 64, Duration: 5 * time.Second, Conn: &pgconn.Config{Host: "127.0.0.1", Port: 5432}, Dir: dir,
	})
	require.NoError(t, err)
	require.Zero(t, res.Transactions)
	require.Equal(t, "pgbench completed no transaction in its 5s run (opening its 64 connections took 4987 ms of it): "+
		"the machine is likely overloaded; try a longer --duration, fewer --clients, or a quieter machine", res.Note)
}
