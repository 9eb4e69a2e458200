package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// relay --exec passes the command's output through to stderr, prefixed
// with the event; reports a failure with its exit status and stderr tail;
// sets absent fields as empty variables. outbox list shows failed and dead
// events with their last error.
func TestOutboxExecOutputAndList(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	ok(t, dbURL, "outbox", "enqueue", "--topic", "mail", "--payload", "hello")
	ok(t, dbURL, "outbox", "enqueue", "--topic", "mail", "--payload", "boom", "--grant-id", "42", "--fencing-token", "9")

	script := `echo "id=$PGQUOTA_EVENT_ID grant=[$PGQUOTA_GRANT_ID] token=[$PGQUOTA_FENCING_TOKEN] body=$(cat)"
if [ "$PGQUOTA_GRANT_ID" = 42 ]; then echo "first complaint" >&2; echo "smtp: 550 mailbox unavailable" >&2; exit 7; fi`
	r := runDB(t, dbURL, "outbox", "relay", "--once", "--max-attempts", "2", "--retry-initial", "1h", "--retry-max", "1h", "--exec", script)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^delivered\s+1$`, r.stdout)
	require.Regexp(t, `(?m)^failed\s+1$`, r.stdout)
	require.Contains(t, r.stderr, "pgquota: event 1 (mail): id=1 grant=[] token=[] body=hello\n", "absent fields are empty, not 0")
	require.Contains(t, r.stderr, "pgquota: event 2 (mail): id=2 grant=[42] token=[9] body=boom\n")
	require.Contains(t, r.stderr, "pgquota: event 2 (mail): smtp: 550 mailbox unavailable\n")
	require.Contains(t, r.stderr, "pgquota: event 2 (mail) failed: exit status 7: first complaint / smtp: 550 mailbox unavailable; attempt 1 of 2: retried later\n")

	// The retrying event, with its error.
	out := ok(t, dbURL, "outbox", "list")
	require.Regexp(t, `(?m)^ID\s+TOPIC\s+STATE\s+ATTEMPTS\s+CREATED\s+LAST ERROR$`, out)
	require.Regexp(t, `(?m)^2\s+mail\s+retrying\s+1\s+\S+\s+exit status 7: first complaint / smtp: 550 mailbox unavailable$`, out)
	require.NotRegexp(t, `(?m)^1\s`, out, "the delivered event is not a failed one")
	require.Contains(t, ok(t, dbURL, "outbox", "list", "--state", "dead"), "(no events)")

	r = runDB(t, dbURL, "--json", "outbox", "list", "--state", "all")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var evs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs), r.stdout)
	require.Len(t, evs, 2)
	require.Equal(t, "delivered", evs[0]["state"])
	require.Equal(t, "", evs[0]["last_error"], "every field is present")
	require.Equal(t, "pending", evs[1]["state"])
	require.Equal(t, 42.0, evs[1]["grant_id"])
	require.Contains(t, evs[1]["last_error"], "smtp: 550")
	require.Contains(t, evs[1], "next_attempt_at")

	requireError(t, runDB(t, dbURL, "outbox", "list", "--state", "lost"), cli.ExitUsage, "state", "lost")
	requireError(t, runDB(t, dbURL, "outbox", "list", "--limit", "-1"), cli.ExitUsage, "limit")

	// A failure with nothing on stderr gives stdout's last lines.
	ok(t, dbURL, "outbox", "enqueue", "--topic", "quiet", "--payload", "x")
	r = runDB(t, dbURL, "outbox", "relay", "--once", "--topic", "quiet", "--max-attempts", "1", "--exec", `echo "HTTP 503"; exit 1`)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "failed: exit status 1: HTTP 503; attempt 1 of 1: dead now, see pgquota outbox list --state dead\n")
	out = ok(t, dbURL, "outbox", "list", "--state", "dead")
	require.Regexp(t, `(?m)^3\s+quiet\s+dead\s+1\s+\S+\s+exit status 1: HTTP 503$`, out)
	require.Equal(t, 2, strings.Count(out, "\n"), out)
}
