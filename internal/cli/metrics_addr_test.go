package cli_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// --metrics-addr on an address that is taken is a usage error naming the
// flag, before anything is delivered, on every command that takes it.
func TestMetricsAddrTakenIsUsageError(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "outbox", "enqueue", "--topic", "t", "--payload", "{}")
	for _, args := range [][]string{
		{"outbox", "relay", "--once"},
		{"bench", "--strategy", "grant-hot", "--clients", "1", "--duration", "1s"},
		{"lab", "--strategy", "conditional"},
	} {
		r := runDB(t, dbURL, append(args, "--metrics-addr", l.Addr().String())...)
		requireError(t, r, cli.ExitUsage, "--metrics-addr "+l.Addr().String())
	}
	// The event is still pending: the relay delivered nothing.
	require.Contains(t, ok(t, dbURL, "outbox", "status"), "1")
}

// With --metrics-addr the relay says where it serves on stderr, and a run
// with --once still delivers and exits 0.
func TestMetricsAddrRelayOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "outbox", "enqueue", "--topic", "t", "--payload", "{}")
	r := runDB(t, dbURL, "outbox", "relay", "--once", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "pgquota: metrics on http://127.0.0.1:")
	require.Contains(t, r.stderr, "/healthz")
	require.Contains(t, r.stdout, `"topic":"t"`)
}
