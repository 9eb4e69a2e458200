package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
)

// runJSONNumbers runs a command with --json and decodes its stdout keeping
// numbers as written (json.Number), so that an integer is told from a
// fraction.
func runJSONNumbers(t *testing.T, dbURL string, code int, args ...string) map[string]any {
	t.Helper()
	r := runDB(t, dbURL, append([]string{"--json"}, args...)...)
	require.Equal(t, code, r.code, "pgquota %s: stderr %q", strings.Join(args, " "), r.stderr)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.UseNumber()
	var m map[string]any
	require.NoError(t, dec.Decode(&m), "stdout %q", r.stdout)
	return m
}

// msOf returns m[key], which must be a whole number (of milliseconds).
func msOf(t *testing.T, m map[string]any, key string) int64 {
	t.Helper()
	n, ok := m[key].(json.Number)
	require.True(t, ok, "%s is a number: %#v in %v", key, m[key], m)
	v, err := n.Int64()
	require.NoError(t, err, "%s = %s is a whole number of milliseconds", key, n)
	return v
}

func timeOf(t *testing.T, m map[string]any, key string) time.Time {
	t.Helper()
	s, ok := m[key].(string)
	require.True(t, ok, "%s is a time: %#v", key, m[key])
	at, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return at
}

// noOldKeys checks that none of the keys renamed to _ms remain.
func noOldKeys(t *testing.T, m map[string]any) {
	t.Helper()
	for k := range m {
		require.False(t, strings.HasSuffix(k, "_seconds") || strings.HasSuffix(k, "_ns") || k == "retry_after" || k == "reset_after" || k == "period",
			"key %q: durations are *_ms", k)
	}
}

// Every duration --json prints is whole milliseconds under a key ending in
// _ms: a rate of 5/m (one unit every 12 s) denied after its burst of 5
// waits 12000 ms at most (not 1.2e10 ns, not 12 s), its period is 60000;
// -1 means no wait helps. The database's clock is pinned (pinClock), so the
// waits are exact whatever the load between two commands.
func TestJSONGrantWaitsInMilliseconds(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	pinClock(t, dbURL, "2026-03-02T10:00:00Z")
	ok(t, dbURL, "quota", "define", "--name", "r", "--rate", "5/m")
	for range 5 {
		ok(t, dbURL, "grant", "--quota", "r", "--member", "m")
	}
	m := runJSONNumbers(t, dbURL, cli.ExitDenied, "grant", "--quota", "r", "--member", "m")
	noOldKeys(t, m)
	retry := msOf(t, m, "retry_after_ms")
	require.Equal(t, int64(12000), retry, "retry_after_ms: the next unit in 12 s on a pinned clock")
	reset := msOf(t, m, "reset_after_ms")
	require.Equal(t, int64(60000), reset, "reset_after_ms: 5 units of 12 s on a pinned clock")
	limits := m["limits"].([]any)
	require.Len(t, limits, 1)
	l := limits[0].(map[string]any)
	noOldKeys(t, l)
	require.Equal(t, int64(60000), msOf(t, l, "period_ms"))
	require.Equal(t, retry, msOf(t, l, "retry_after_ms"))
	require.Equal(t, reset, msOf(t, l, "reset_after_ms"))

	never := runJSONNumbers(t, dbURL, cli.ExitDenied, "grant", "--quota", "r", "--member", "m", "--amount", "6")
	require.Equal(t, int64(-1), msOf(t, never, "retry_after_ms"), "above the burst: never")

	granted := runJSONNumbers(t, dbURL, cli.ExitOK, "grant", "--quota", "lim", "--member", "m")
	require.Equal(t, int64(0), msOf(t, granted, "retry_after_ms"), "a calendar grant reports no wait")
}

// pgquota usage --json on a rate, a fixed window and a rolling window:
// period_ms, and waits in whole milliseconds rounded up from the database
// clock's instant (db_now). That clock is pinned (pinClock), so the waits
// are exact whatever the load between two commands.
func TestJSONUsageWaitsInMilliseconds(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	pinClock(t, dbURL, "2026-03-02T10:00:00.25Z")
	ok(t, dbURL, "quota", "define", "--name", "r", "--rate", "5/m")
	ok(t, dbURL, "quota", "define", "--name", "f", "--window", "90s", "--limit", "5")
	ok(t, dbURL, "quota", "define", "--name", "w", "--rolling", "1h", "--limit", "5")
	for _, q := range []string{"r", "f", "w"} {
		ok(t, dbURL, "grant", "--quota", q, "--member", "m", "--amount", "2")
	}

	r := runJSONNumbers(t, dbURL, cli.ExitOK, "usage", "--quota", "r", "--member", "m")
	noOldKeys(t, r)
	require.Equal(t, "rate", r["window"])
	require.Equal(t, int64(60000), msOf(t, r, "period_ms"))
	require.Equal(t, int64(3), msOf(t, r, "remaining"))
	refill := msOf(t, r, "refill_after_ms")
	require.Equal(t, int64(12000), refill, "refill_after_ms: one unit every 12 s on a pinned clock")
	reset := msOf(t, r, "reset_after_ms")
	require.Equal(t, int64(24000), reset, "reset_after_ms: 2 units of 12 s on a pinned clock")

	f := runJSONNumbers(t, dbURL, cli.ExitOK, "usage", "--quota", "f", "--member", "m")
	require.Equal(t, int64(90000), msOf(t, f, "period_ms"))
	start, end, at := timeOf(t, f, "window_start"), timeOf(t, f, "window_end"), timeOf(t, f, "db_now")
	require.Equal(t, 90*time.Second, end.Sub(start))
	left := end.Sub(at)
	require.Equal(t, int64((left+time.Millisecond-1)/time.Millisecond), msOf(t, f, "reset_after_ms"), "the window's end, rounded up")
	require.Equal(t, int64(3), msOf(t, f, "remaining"))

	w := runJSONNumbers(t, dbURL, cli.ExitOK, "usage", "--quota", "w", "--member", "m")
	require.Equal(t, int64(3600000), msOf(t, w, "period_ms"))
	require.Equal(t, int64(2), msOf(t, w, "used"))
	reset = msOf(t, w, "reset_after_ms")
	require.Equal(t, int64(3600000), reset, "reset_after_ms: the grant leaves in 1 h on a pinned clock")
	require.Equal(t, reset, msOf(t, w, "refill_after_ms"), "one grant: the oldest is the newest")
	require.Nil(t, w["window_start"])

	text := ok(t, dbURL, "usage", "--quota", "r", "--member", "m")
	require.Regexp(t, `(?m)^kind\s+rate$`, text)
	require.Regexp(t, `(?m)^remaining\s+3$`, text)
	require.Regexp(t, `(?m)^refill after\s+12s$`, text)
	require.Regexp(t, `(?m)^reset after\s+24s$`, text)
}

// quota define and quota list print a shape's length as period_ms.
func TestJSONQuotaPeriodInMilliseconds(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	m := runJSONNumbers(t, dbURL, cli.ExitOK, "quota", "define", "--name", "f", "--window", "90s", "--limit", "5")
	noOldKeys(t, m)
	require.Equal(t, int64(90000), msOf(t, m, "period_ms"))
	r := runDB(t, dbURL, "--json", "quota", "list")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.UseNumber()
	var list []map[string]any
	require.NoError(t, dec.Decode(&list))
	periods := map[string]int64{}
	for _, q := range list {
		periods[q["quota"].(string)] = msOf(t, q, "period_ms")
	}
	require.Equal(t, map[string]int64{"f": 90000, "lim": 0, "q": 0}, periods)
}

// Leases and slots: remaining_ms is the TTL left by the database clock,
// rounded down (expires_at - db_now); a full semaphore's retry_after_ms the
// wait until its first slot expires. slot JSON names the semaphore
// "semaphore" and the slot's lease "lease"; slot show counts the held slots
// as "holders" and "held" is each slot's own.
func TestJSONLeaseAndSlotTimesInMilliseconds(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	l := runJSONNumbers(t, dbURL, cli.ExitOK, "lease", "acquire", "--name", "job", "--ttl", "1m")
	noOldKeys(t, l)
	left := timeOf(t, l, "expires_at").Sub(timeOf(t, l, "db_now"))
	require.Equal(t, left.Milliseconds(), msOf(t, l, "remaining_ms"))
	require.True(t, msOf(t, l, "remaining_ms") > 59000 && msOf(t, l, "remaining_ms") <= 60000)

	s := runJSONNumbers(t, dbURL, cli.ExitOK, "slot", "acquire", "--name", "sem", "--limit", "1", "--ttl", "1m")
	noOldKeys(t, s)
	require.Equal(t, "sem", s["semaphore"])
	require.Equal(t, "slot:sem:0", s["lease"])
	require.NotContains(t, s, "name")
	require.Equal(t, true, s["held"])
	require.Equal(t, int64(1), msOf(t, s, "holders"))
	left = timeOf(t, s, "expires_at").Sub(timeOf(t, s, "db_now"))
	require.Equal(t, left.Milliseconds(), msOf(t, s, "remaining_ms"))

	full := runJSONNumbers(t, dbURL, cli.ExitDenied, "slot", "acquire", "--name", "sem", "--limit", "1", "--ttl", "1m")
	noOldKeys(t, full)
	retry := msOf(t, full, "retry_after_ms")
	require.True(t, retry > 59000 && retry <= 60000, "retry_after_ms %d: the slot expires in 1 m", retry)
	require.Equal(t, "sem", full["semaphore"])

	show := runJSONNumbers(t, dbURL, cli.ExitOK, "slot", "show", "--name", "sem")
	require.Equal(t, "sem", show["semaphore"])
	require.NotContains(t, show, "name")
	require.NotContains(t, show, "held")
	require.Equal(t, int64(1), msOf(t, show, "holders"))
	slots := show["slots"].([]any)
	require.Len(t, slots, 1)
	one := slots[0].(map[string]any)
	noOldKeys(t, one)
	require.Equal(t, "slot:sem:0", one["lease"])
	require.Equal(t, true, one["held"])
	require.NotContains(t, one, "holders")
	require.NotContains(t, one, "name")
	require.Positive(t, msOf(t, one, "remaining_ms"))
}

// The reaps' --older-than, the outbox lag, migration and grant --file run
// times: whole milliseconds.
func TestJSONAdminDurationsInMilliseconds(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	m := runJSONNumbers(t, dbURL, cli.ExitOK, "ledger", "reap", "--older-than", "720h")
	noOldKeys(t, m)
	require.Equal(t, int64(720*3600*1000), msOf(t, m, "older_than_ms"))
	m = runJSONNumbers(t, dbURL, cli.ExitOK, "lease", "reap", "--older-than", "24h")
	noOldKeys(t, m)
	require.Equal(t, int64(86400000), msOf(t, m, "older_than_ms"))

	ok(t, dbURL, "outbox", "enqueue", "--topic", "t", "--payload", `{"a":1}`)
	time.Sleep(300 * time.Millisecond)
	m = runJSONNumbers(t, dbURL, cli.ExitOK, "outbox", "status")
	noOldKeys(t, m)
	lag := msOf(t, m, "lag_ms")
	require.True(t, lag >= 300 && lag < 60000, "lag_ms %d: the event is 300 ms old", lag)

	m = runJSONNumbers(t, dbURL, cli.ExitOK, "migrate", "down")
	applied := m["applied"].([]any)
	require.Len(t, applied, 1)
	noOldKeys(t, applied[0].(map[string]any))
	require.GreaterOrEqual(t, msOf(t, applied[0].(map[string]any), "duration_ms"), int64(0))
	ok(t, dbURL, "migrate", "up")

	file := filepath.Join(t.TempDir(), "rows.csv")
	require.NoError(t, os.WriteFile(file, []byte("quota,member,amount\nlim,a,1\n"), 0o600))
	m = runJSONNumbers(t, dbURL, cli.ExitOK, "grant", "--file", file)
	noOldKeys(t, m)
	require.Equal(t, int64(1), msOf(t, m, "granted"))
	require.GreaterOrEqual(t, msOf(t, m, "elapsed_ms"), int64(0))
	require.NotContains(t, m, "seconds")
}
