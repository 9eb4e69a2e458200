package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// TestLeaseTokensIncreaseAcrossFailoverToLaggingStandby proves that every
// token issued after a standby is promoted exceeds every token the old
// primary issued, also those the standby never received, and that the old
// holder's writes with its old token are then rejected: on fenced rows
// checked against the lease, on fenced rows with external-style tokens
// (no lease check), and on a table with the guard trigger. A real primary
// and a real asynchronous streaming standby (pg_basebackup -R) run on
// loopback ports; the standby is cut off from the WAL stream, the primary
// issues more tokens and is shut down in immediate mode, and the standby
// is promoted with pg_promote(). The clients run as a role without
// superuser.
func TestLeaseTokensIncreaseAcrossFailoverToLaggingStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		leaseName = "public.reports" // protects the guarded table and its fenced rows
		ext       = "ext"            // a resource written with external-style tokens
	)
	primary := pgcluster.New(t, "primary", nil)
	primary.CreateDatabase("app")
	primary.Exec("app", `CREATE ROLE app LOGIN;
		GRANT pgquota_app TO app;
		CREATE TABLE public.reports (id int PRIMARY KEY, val text NOT NULL, tok bigint);
		GRANT SELECT, INSERT, UPDATE, DELETE ON public.reports TO app`)
	admin, err := quota.New(pgcluster.Pool(t, primary.URL("app")), nil)
	require.NoError(t, err)
	_, err = fenceOf(t, admin).GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "tok"})
	require.NoError(t, err)
	admin.Pool().Close()

	old := failoverClient(t, primary)
	var issued []int64 // every token the old primary issued
	a0, err := leaseOf(t, old).Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "A0", TTL: time.Hour})
	require.NoError(t, err)
	issued = append(issued, a0.Token)
	require.NoError(t, guardedWrite(ctx, old.Pool(), 1, "A0", a0.Token, leaseName))
	_, err = leaseOf(t, old).Release(ctx, lease.Lease{Name: leaseName, Token: a0.Token})
	require.NoError(t, err)

	standby := primary.NewStandby("standby")
	standby.CutOff()

	// What the standby misses: 100 tokens, then holder A's lease and writes.
	for range 100 {
		l, err := leaseOf(t, old).Acquire(ctx, lease.AcquireRequest{Name: "spin", Holder: "S", TTL: time.Hour})
		require.NoError(t, err)
		issued = append(issued, l.Token)
		_, err = leaseOf(t, old).Release(ctx, l)
		require.NoError(t, err)
	}
	a, err := leaseOf(t, old).Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	issued = append(issued, a.Token)
	_, err = fenceOf(t, old).WriteRow(ctx, fence.WriteRowRequest{Resource: leaseName, Key: "k", Value: "A", Token: a.Token, Lease: leaseName})
	require.NoError(t, err)
	_, err = fenceOf(t, old).WriteRow(ctx, fence.WriteRowRequest{Resource: ext, Key: "k", Value: "A", Token: a.Token})
	require.NoError(t, err)
	require.NoError(t, guardedWrite(ctx, old.Pool(), 1, "A", a.Token, leaseName))
	var oldTimeline int64
	primary.QueryValue("app", walTimeline, &oldTimeline)
	old.Pool().Close()

	primary.Crash()
	standby.Promote()

	cur := failoverClient(t, standby)
	var newTimeline int64
	standby.QueryValue("app", walTimeline, &newTimeline)
	got, err := leaseOf(t, cur).Get(ctx, leaseName)
	require.NoError(t, err)
	require.Equal(t, "A0", got.Holder, "the standby missed A's acquire (else this test proves nothing)")

	b, err := leaseOf(t, cur).Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "B", TTL: time.Hour})
	require.NoError(t, err)
	highest := a0.Token
	for _, tok := range issued {
		highest = max(highest, tok)
	}
	t.Logf("old primary (timeline %d): %d tokens, %d to %d; A holds %d. New primary (timeline %d): B acquires %d",
		oldTimeline, len(issued), issued[0], highest, a.Token, newTimeline, b.Token)
	assert.Greater(t, b.Token, highest, "the first token after the promotion exceeds every token the old primary issued")

	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: ext, Key: "k", Value: "B", Token: b.Token})
	require.NoError(t, err, "B's external-style write")
	require.NoError(t, guardedWrite(ctx, cur.Pool(), 1, "B", b.Token, leaseName), "B's guarded write")

	// A still believes it holds the lease and writes with its old token.
	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: leaseName, Key: "k", Value: "A stale", Token: a.Token, Lease: leaseName})
	assert.ErrorIs(t, err, fence.ErrStaleToken, "A's fenced write checked against the lease")
	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: ext, Key: "k", Value: "A stale", Token: a.Token})
	assert.ErrorIs(t, err, fence.ErrStaleToken, "A's external-style fenced write")
	assertGuardRejects(ctx, t, cur.Pool(), 1, a.Token)

	// B is not locked out by its own token, and its values stand.
	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: ext, Key: "k", Value: "B again", Token: b.Token})
	assert.NoError(t, err)
	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: leaseName, Key: "k", Value: "B", Token: b.Token, Lease: leaseName})
	assert.NoError(t, err)
	var val string
	require.NoError(t, cur.Pool().QueryRow(ctx, "SELECT val FROM public.reports WHERE id = 1").Scan(&val))
	assert.Equal(t, "B", val)

	var ceiling int64
	standby.QueryValue("app", "SELECT pgquota.lease_token_ceiling()", &ceiling)
	assert.GreaterOrEqual(t, ceiling, b.Token, "lease_token_ceiling() covers the tokens issued")
}

// walTimeline reads the server's WAL insert timeline.
const walTimeline = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"

// guardedWrite and assertGuardRejects are the only places that write the
// guarded table public.reports (guard attached with GuardTable on
// column tok): the writer presents its token in the transaction
// (pgquota.present_token, checked against the lease named lease), and the
// guard stamps it into the row.
func guardedWrite(ctx context.Context, pool *pgxpool.Pool, id int, val string, token int64, leaseName string) error {
	var leaseArg any = leaseName
	if leaseName == "" { // an external-guarded table: no lease is named
		leaseArg = nil
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgquota.present_token('public.reports', $1, $2)`, token, leaseArg); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO public.reports (id, val, tok) VALUES ($1, $2, NULL)
			ON CONFLICT (id) DO UPDATE SET val = excluded.val`, id, val)
		return err
	})
	return fence.MapError(err)
}

// assertGuardRejects checks that a write of row id with the stale token is
// rejected by the guard with SQLSTATE PQ001 and changes nothing.
func assertGuardRejects(ctx context.Context, t *testing.T, pool *pgxpool.Pool, id int, stale int64) {
	t.Helper()
	err := guardedWrite(ctx, pool, id, "stale", stale, "public.reports")
	var pgErr *pgconn.PgError
	if assert.True(t, errors.As(err, &pgErr), "the guard rejects the stale write with a database error, got %v", err) {
		assert.Equal(t, fence.SQLStateStaleToken, pgErr.Code)
	}
	assert.ErrorIs(t, err, fence.ErrStaleToken)
}
