package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// pgq runs the pgquota command line against dbURL and returns its exit
// status, stdout and stderr.
func pgq(t *testing.T, dbURL string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Run(context.Background(), append([]string{"--database-url", dbURL}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// pgqJSON runs a command with --json, requires exit status want, and
// decodes its output.
func pgqJSON(t *testing.T, dbURL string, want int, args ...string) map[string]any {
	t.Helper()
	code, out, errOut := pgq(t, dbURL, append(args, "--json")...)
	require.Equal(t, want, code, "pgquota %s: %s", strings.Join(args, " "), errOut)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m), out)
	return m
}

// The "done when": the same `pgquota grant --idempotency-key K`
// run twice moves the counter once and prints the same grant id both times.
func TestGrantIdempotencyKeyTwice(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	pgqJSON(t, dbURL, 0, "quota", "define", "--name", "points", "--window", "day", "--limit", "10")

	grant := []string{"grant", "--quota", "points", "--member", "alice", "--amount", "3", "--idempotency-key", "order-1234"}
	first := pgqJSON(t, dbURL, 0, grant...)
	second := pgqJSON(t, dbURL, 0, grant...)
	require.Equal(t, true, first["granted"])
	require.NotZero(t, first["grant_id"])
	require.Equal(t, first["grant_id"], second["grant_id"], "the same grant id both times")
	require.Equal(t, false, first["replayed"])
	require.Equal(t, true, second["replayed"])
	require.Equal(t, "points", second["idempotency_scope"])

	u := pgqJSON(t, dbURL, 0, "usage", "--quota", "points", "--member", "alice")
	require.Equal(t, float64(3), u["used"], "the counter moved once")

	// Text output names the grant id too.
	code, out, _ := pgq(t, dbURL, grant...)
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^grant id +[0-9]+$`, out)
	require.Contains(t, out, "replayed         yes")

	// The same key with another amount: exit 2, nothing written.
	code, _, errOut := pgq(t, dbURL, "grant", "--quota", "points", "--member", "alice", "--amount", "4", "--idempotency-key", "order-1234")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "idempotency key reused")
	u = pgqJSON(t, dbURL, 0, "usage", "--quota", "points", "--member", "alice")
	require.Equal(t, float64(3), u["used"])

	// A denied keyed grant exits 3, and so does its replay.
	deny := []string{"grant", "--quota", "points", "--member", "alice", "--amount", "8", "--idempotency-key", "order-1235"}
	d1 := pgqJSON(t, dbURL, cli.ExitDenied, deny...)
	d2 := pgqJSON(t, dbURL, cli.ExitDenied, deny...)
	require.Equal(t, d1["grant_id"], d2["grant_id"])
}

func TestRevokeGrantAndLedgerCommands(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	pgqJSON(t, dbURL, 0, "quota", "define", "--name", "points", "--window", "none", "--limit", "10")
	g := pgqJSON(t, dbURL, 0, "grant", "--quota", "points", "--member", "bob", "--amount", "4", "--idempotency-key", "k1")
	id := jsonInt(g["grant_id"])

	r1 := pgqJSON(t, dbURL, 0, "compensate", "--grant-id", id)
	require.Equal(t, float64(4), r1["revoked"])
	require.Equal(t, false, r1["replayed"])
	r2 := pgqJSON(t, dbURL, 0, "compensate", "--grant-id", id)
	require.Equal(t, float64(4), r2["revoked"])
	require.Equal(t, true, r2["replayed"])
	u := pgqJSON(t, dbURL, 0, "usage", "--quota", "points", "--member", "bob")
	require.Equal(t, float64(0), u["used"], "units given back once")

	// A keyed revoke by quota and member.
	pgqJSON(t, dbURL, 0, "grant", "--quota", "points", "--member", "bob", "--amount", "5")
	for range 2 {
		r := pgqJSON(t, dbURL, 0, "revoke", "--quota", "points", "--member", "bob", "--amount", "2", "--idempotency-key", "refund-1")
		require.Equal(t, float64(2), r["revoked"])
	}
	u = pgqJSON(t, dbURL, 0, "usage", "--quota", "points", "--member", "bob")
	require.Equal(t, float64(3), u["used"])

	e := pgqJSON(t, dbURL, 0, "ledger", "show", "--grant-id", id)
	require.Equal(t, "grant", e["operation"])
	require.Equal(t, "k1", e["idempotency_key"])
	require.NotNil(t, e["compensation"])
	e2 := pgqJSON(t, dbURL, 0, "ledger", "show", "--scope", "points", "--key", "k1")
	require.Equal(t, e, e2)
	code, out, _ := pgq(t, dbURL, "ledger", "show", "--grant-id", id)
	require.Equal(t, 0, code)
	require.Contains(t, out, "compensated")

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"ledger", "show", "--grant-id", "999999"}, cli.ExitUsage, "not found"},
		{[]string{"ledger", "show"}, cli.ExitUsage, "--grant-id"},
		{[]string{"compensate", "--grant-id", "999999"}, cli.ExitUsage, "not found"},
		{[]string{"compensate"}, cli.ExitUsage, `"grant-id" not set`},
		{[]string{"revoke", "--grant-id", id}, cli.ExitUsage, "pgquota compensate --grant-id"},
		{[]string{"revoke", "--quota", "points", "--member", "bob"}, cli.ExitUsage, `"amount" not set`},
		{[]string{"ledger", "reap"}, cli.ExitUsage, "older-than"},
		{[]string{"ledger", "reap", "--older-than", "0s"}, cli.ExitUsage, "at least 1s"},
	} {
		code, _, errOut := pgq(t, dbURL, tc.args...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.msg, tc.args)
	}

	reaped := pgqJSON(t, dbURL, 0, "ledger", "reap", "--older-than", "720h")
	require.Equal(t, float64(0), reaped["deleted"], "nothing is that old")
}

func TestVoucherClaimIdempotencyKey(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	pgqJSON(t, dbURL, 0, "voucher", "create", "--campaign", "bf", "--total", "1")
	c1 := pgqJSON(t, dbURL, 0, "voucher", "claim", "--campaign", "bf", "--member", "alice", "--idempotency-key", "click")
	c2 := pgqJSON(t, dbURL, 0, "voucher", "claim", "--campaign", "bf", "--member", "alice", "--idempotency-key", "click")
	require.Equal(t, c1["grant_id"], c2["grant_id"])
	require.Equal(t, true, c2["replayed"])
	pgqJSON(t, dbURL, cli.ExitDenied, "voucher", "claim", "--campaign", "bf", "--member", "bob", "--idempotency-key", "b")

	code, _, errOut := pgq(t, dbURL, "voucher", "import", "--campaign", "codes", "--file", writeTemp(t, "A\nB\n"))
	require.Equal(t, 0, code, errOut)
	k1 := pgqJSON(t, dbURL, 0, "voucher", "claim", "--campaign", "codes", "--member", "alice", "--idempotency-key", "c")
	k2 := pgqJSON(t, dbURL, 0, "voucher", "claim", "--campaign", "codes", "--member", "alice", "--idempotency-key", "c")
	require.Equal(t, k1["code"], k2["code"])
	require.Equal(t, k1["grant_id"], k2["grant_id"])
}

func TestOutboxCommands(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	pgqJSON(t, dbURL, 0, "outbox", "enqueue", "--topic", "grant.made", "--payload", `{"order":1}`, "--grant-id", "7")
	pgqJSON(t, dbURL, 0, "outbox", "enqueue", "--topic", "raw", "--payload", "not json")
	st := pgqJSON(t, dbURL, 0, "outbox", "status")
	require.Equal(t, float64(2), st["pending"])

	// A failing command: the event is retried, then dead.
	code, out, errOut := pgq(t, dbURL, "outbox", "relay", "--once", "--topic", "raw", "--max-attempts", "1",
		"--exec", `test "$PGQUOTA_EVENT_TOPIC" = raw && test "$(cat)" = "not json" && echo refused >&2 && exit 1`)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "dead       1")

	// The JSON-lines relay delivers the other one.
	code, out, errOut = pgq(t, dbURL, "outbox", "relay", "--once")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "delivered 1")
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &line), out)
	require.Equal(t, "grant.made", line["topic"])
	require.Equal(t, map[string]any{"order": float64(1)}, line["payload"])
	require.Equal(t, float64(7), line["grant_id"])

	st = pgqJSON(t, dbURL, 0, "outbox", "status")
	require.Equal(t, float64(0), st["pending"])
	require.Equal(t, float64(1), st["delivered"])
	require.Equal(t, float64(1), st["dead"])
	reaped := pgqJSON(t, dbURL, 0, "outbox", "reap", "--older-than", "1h")
	require.Equal(t, float64(0), reaped["deleted"])

	code, _, errOut = pgq(t, dbURL, "outbox", "enqueue", "--topic", "t")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "--payload")
}

// jsonInt formats a JSON number as a decimal integer.
func jsonInt(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// writeTemp writes s to a file in the test's temporary directory.
func writeTemp(t *testing.T, s string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "codes")
	require.NoError(t, err)
	_, err = f.WriteString(s)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return f.Name()
}
