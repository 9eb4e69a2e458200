package lease_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
)

// TestLeaseTokensIgnoreASessionsSystemIdentifierSetting proves that no
// client-settable session state decides a token or an epoch: a session
// that sets pgquota.system_identifier (which 00007 read as its cache of
// pg_control_system()) gets tokens in the same epoch, one after the other,
// and the recorded epoch does not move. On 00007 each acquire on such a
// session saw "another cluster" and raised the epoch by the timeline.
func TestLeaseTokensIgnoreASessionsSystemIdentifierSetting(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	first, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r0", Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	before, err := b.leases.Epoch(b.ctx)
	require.NoError(t, err)

	// In one transaction, so that behind a transaction pooler too the
	// acquires run on the server session that carries the setting.
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET pgquota.system_identifier = '12345'`); err != nil {
			return err
		}
		prev := first.Token
		for i := range 6 {
			l, err := b.leases.AcquireTx(b.ctx, tx, lease.AcquireRequest{Name: "r" + strconv.Itoa(i+1), Holder: "A", TTL: time.Hour})
			require.NoError(t, err)
			require.Equal(t, first.Token>>lease.TokenEpochShift, l.Token>>lease.TokenEpochShift, "acquire %d: the epoch", i+1)
			require.Equal(t, prev+1, l.Token, "acquire %d: the next token of the sequence", i+1)
			prev = l.Token
		}
		var setting string
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT current_setting('pgquota.system_identifier')`).Scan(&setting))
		require.Equal(t, "12345", setting, "the session carries the setting")
		return nil
	}))
	after, err := b.leases.Epoch(b.ctx)
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

// BenchmarkAcquireSystemIdentifier measures Acquire (one acquire of a
// fresh name per call, one connection per database) with the system
// identifier read from pg_control_system() on every token (migration
// 00019) and cached in a session setting (00007, installed in a second
// database), in one run: the two alternate call by call, so both see the
// same load, and the benchmark reports each one's mean (ns/acquire) and
// their ratio. The same for pgquota.system_identifier() alone.
func BenchmarkAcquireSystemIdentifier(b *testing.B) {
	ctx := context.Background()
	open := func(ddl string) *quota.Client {
		dbURL := pgtest.NewURL(b)
		if ddl != "" {
			_, err := pgtest.ConnectOwner(b, dbURL, 1).Exec(ctx, ddl)
			require.NoError(b, err)
		}
		c, err := quota.New(pgtest.Connect(b, dbURL, 1), nil)
		require.NoError(b, err)
		return c
	}
	controlFile, sessionSetting := open(""), open(systemIdentifierFromSessionSetting)
	next := 0 // lease names are never reused: the benchmark function runs more than once
	for _, op := range []struct {
		name string
		run  func(c *quota.Client, i int) error
	}{
		{"acquire", func(c *quota.Client, i int) error {
			_, err := leaseOf(b, c).Acquire(ctx, lease.AcquireRequest{Name: "bench-" + strconv.Itoa(i), Holder: "B", TTL: time.Hour})
			return err
		}},
		{"system_identifier", func(c *quota.Client, _ int) error {
			var v int64
			return c.Pool().QueryRow(ctx, `SELECT pgquota.system_identifier()`).Scan(&v)
		}},
	} {
		b.Run(op.name, func(b *testing.B) {
			var inControl, inSession time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				next++
				if err := op.run(controlFile, next); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := op.run(sessionSetting, next); err != nil {
					b.Fatal(err)
				}
				inControl += t1.Sub(t0)
				inSession += time.Since(t1)
			}
			b.ReportMetric(float64(inControl.Nanoseconds())/float64(b.N), "ns/control-file")
			b.ReportMetric(float64(inSession.Nanoseconds())/float64(b.N), "ns/session-setting")
			b.ReportMetric(float64(inControl)/float64(inSession), "ratio")
		})
	}
}
