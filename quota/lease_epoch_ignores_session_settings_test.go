package quota_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// TestLeaseTokensIgnoreASessionsSystemIdentifierSetting proves that no
// client-settable session state decides a token or an epoch: a session
// that sets pgquota.system_identifier (which 00007 read as its cache of
// pg_control_system()) gets tokens in the same epoch, one after the other,
// and the recorded epoch does not move. On 00007 each acquire on such a
// session saw "another cluster" and raised the epoch by the timeline.
func TestLeaseTokensIgnoreASessionsSystemIdentifierSetting(t *testing.T) {
	t.Parallel()
	b := setup(t, 1) // one connection: the SET stays on the session the acquires use
	first, err := b.client.Acquire(b.ctx, quota.AcquireRequest{Name: "r0", Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	before, err := b.client.LeaseEpoch(b.ctx)
	require.NoError(t, err)

	_, err = b.pool.Exec(b.ctx, `SET pgquota.system_identifier = '12345'`)
	require.NoError(t, err)
	prev := first.Token
	for i := range 6 {
		l, err := b.client.Acquire(b.ctx, quota.AcquireRequest{Name: "r" + strconv.Itoa(i+1), Holder: "A", TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, first.Token>>quota.LeaseTokenEpochShift, l.Token>>quota.LeaseTokenEpochShift, "acquire %d: the epoch", i+1)
		require.Equal(t, prev+1, l.Token, "acquire %d: the next token of the sequence", i+1)
		prev = l.Token
	}
	var setting string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT current_setting('pgquota.system_identifier')`).Scan(&setting))
	require.Equal(t, "12345", setting, "the session still carries the setting")
	after, err := b.client.LeaseEpoch(b.ctx)
	require.NoError(t, err)
	require.Equal(t, before.Epoch, after.Epoch)
	require.Equal(t, before.Recorded, after.Recorded)
	require.Equal(t, before.Offset, after.Offset)
	var sys, control int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pgquota.system_identifier(), (SELECT system_identifier FROM pg_control_system())`).Scan(&sys, &control))
	require.Equal(t, control, sys, "pgquota.system_identifier() is the server's, whatever the session set")
}

// systemIdentifierFromSessionSetting is pgquota.system_identifier() as
// migration 00007 created it: pg_control_system() cached in the session
// setting pgquota.system_identifier. BenchmarkAcquireSystemIdentifier
// installs it to compare.
const systemIdentifierFromSessionSetting = `CREATE OR REPLACE FUNCTION pgquota.system_identifier() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v text := current_setting('pgquota.system_identifier', true);
BEGIN
    IF v IS NULL OR v = '' THEN
        v := (SELECT system_identifier FROM pg_control_system())::text;
        PERFORM set_config('pgquota.system_identifier', v, false);
    END IF;
    RETURN v::bigint;
END
$$`

// BenchmarkAcquireSystemIdentifier measures Acquire (each iteration one
// acquire of a fresh name, one connection) with the system identifier read
// from pg_control_system() on every token (control-file, migration 00019)
// and cached in a session setting (session-setting, 00007), in one run.
func BenchmarkAcquireSystemIdentifier(b *testing.B) {
	for _, bc := range []struct {
		name string
		ddl  string
	}{
		{"control-file", ""},
		{"session-setting", systemIdentifierFromSessionSetting},
		{"control-file-again", ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			dbURL := pgtest.NewURL(b)
			if bc.ddl != "" {
				owner := pgtest.ConnectOwner(b, dbURL, 1)
				_, err := owner.Exec(ctx, bc.ddl)
				require.NoError(b, err)
			}
			c, err := quota.New(pgtest.Connect(b, dbURL, 1), nil)
			require.NoError(b, err)
			names := make([]string, b.N)
			for i := range names {
				names[i] = "bench-" + strconv.Itoa(i)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Acquire(ctx, quota.AcquireRequest{Name: names[i], Holder: "B", TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
