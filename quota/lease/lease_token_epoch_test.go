package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// TestLeaseTokenCarriesTheTimelineEpoch proves the token layout: (epoch <<
// 40) + n, the epoch being the server's WAL timeline plus the recorded
// offset, and lease_token_ceiling() at least every token issued and below
// the next one.
func TestLeaseTokenCarriesTheTimelineEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	var timeline, offset int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pgquota.wal_timeline(), timeline_offset FROM pgquota.lease_epoch`).Scan(&timeline, &offset))
	var last int64
	for range 3 {
		l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r", Holder: "A", TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, timeline+offset, l.Token>>40, "token %d's epoch", l.Token)
		require.Greater(t, l.Token, last)
		last = l.Token
		var ceiling int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pgquota.lease_token_ceiling()`).Scan(&ceiling))
		require.Equal(t, l.Token, ceiling, "no other token was issued since")
		_, err = b.leases.Release(b.ctx, lease.Lease{Name: "r", Token: l.Token})
		require.NoError(t, err)
	}
}

// execAll runs statements one by one, each with args when it has $1.
func execAll(t *testing.T, pool *pgxpool.Pool, statements []string, arg any) {
	t.Helper()
	for _, st := range statements {
		var err error
		if arg != nil && strings.Contains(st, "$1") {
			_, err = pool.Exec(context.Background(), st, arg)
		} else {
			_, err = pool.Exec(context.Background(), st)
		}
		require.NoError(t, err, st)
	}
}

// TestLeaseEpochRisesOnAnotherClusterAndOnBump proves what keeps tokens
// increasing when the timeline does not: a database restored into another
// cluster (its lease_epoch row names another system identifier, as after
// pg_dump/pg_restore or pg_upgrade) issues tokens above the recorded epoch,
// and lease_epoch_bump raises the epoch further.
func TestLeaseEpochRisesOnAnotherClusterAndOnBump(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	// As if restored from a dump of a cluster that had issued tokens in
	// epoch 5, up to n = 1000.
	old := int64(5)<<40 + 1000
	execAll(t, b.owner, []string{
		`UPDATE pgquota.lease_epoch SET system_identifier = 42, timeline_offset = 4, epoch = 5`,
		`SELECT setval('pgquota.lease_token', 1000)`,
		`INSERT INTO pgquota.lease (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
		 VALUES ('r', 'old', 'old', $1, now(), now(), now() - interval '1 s')`,
		`INSERT INTO pgquota.fence (resource, max_token, updated_at) VALUES ('r', $1, now())`,
	}, old)
	l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r", Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	require.Greater(t, l.Token>>40, int64(5), "a new epoch on another cluster")
	require.Greater(t, l.Token, old)
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: "r", Key: "k", Token: l.Token, Lease: "r"})
	require.NoError(t, err, "the new holder is not locked out by the old mark")

	var bumped int64
	require.NoError(t, b.operator.Pool().QueryRow(b.ctx, `SELECT pgquota.lease_epoch_bump(NULL)`).Scan(&bumped))
	require.Equal(t, l.Token>>40+1, bumped)
	require.NoError(t, b.operator.Pool().QueryRow(b.ctx, `SELECT pgquota.lease_epoch_bump(100)`).Scan(&bumped))
	require.Equal(t, int64(100), bumped)
	l2, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "s", Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, int64(100), l2.Token>>40)
}

// TestLeaseTokenSequenceEndsWithAnErrorNotAWrap: the sequence part stays
// below 2^40; past it an acquire fails with SQLSTATE 2200H and issues
// nothing.
func TestLeaseTokenSequenceEndsWithAnErrorNotAWrap(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	execAll(t, b.owner, []string{`SELECT setval('pgquota.lease_token', 1099511627775)`}, nil)
	_, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: "r", Holder: "A", TTL: time.Hour})
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "got %v", err)
	require.Equal(t, "2200H", pgErr.Code)
	require.Equal(t, int64(0), b.countRows(t, "lease"))
}

// TestLeaseTokensMigrateForward proves that migration 7 keeps tokens issued
// before it valid (a held lease renews and writes with its token, fence
// marks stay) and that every token issued after it exceeds every old one,
// also when the old sequence had gone past 2^40; and that after migrating
// down again the old scheme's tokens continue above the new ones.
func TestLeaseTokensMigrateForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.ConnectOwner(t, pgtest.NewEmptyURL(t), 4) // migrates: the owner
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	require.NoError(t, migrations.EnsureSchema(ctx, sqlDB))
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 5)
	require.NoError(t, err)

	fenceAdmit := func() string {
		var def string
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_functiondef('pgquota.fence_admit'::regproc)`).Scan(&def))
		return def
	}
	before := fenceAdmit()
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	execAll(t, pool, []string{`SELECT setval('pgquota.lease_token', 3 * (1::bigint << 40) + 7)`}, nil)
	var oldToken int64
	// A lease taken the old way (nextval), with the highest old token.
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO pgquota.lease (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
		VALUES ('held', 'A', 'a', nextval('pgquota.lease_token'), now(), now(), now() + interval '1 hour') RETURNING token`).Scan(&oldToken))
	execAll(t, pool, []string{`INSERT INTO pgquota.fence (resource, max_token, updated_at) VALUES ('held', $1, now())`}, oldToken)

	_, err = p.Up(ctx)
	require.NoError(t, err)
	_, err = leaseOf(t, client).Renew(ctx, lease.Lease{Name: "held", Token: oldToken}, time.Hour)
	require.NoError(t, err, "a lease held before the migration renews with its token")
	_, err = fenceOf(t, client).WriteRow(ctx, fence.WriteRowRequest{Resource: "held", Key: "k", Token: oldToken, Lease: "held"})
	require.NoError(t, err, "and writes with it")
	l, err := leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: "new", Holder: "B", TTL: time.Hour})
	require.NoError(t, err)
	require.Greater(t, l.Token, oldToken, "a token issued after the migration exceeds every old one")

	_, err = p.DownTo(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, before, fenceAdmit(), "migrating down restores fence_admit")
	var afterDown int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT nextval('pgquota.lease_token')`).Scan(&afterDown))
	require.Greater(t, afterDown, l.Token, "after migrating down, the old scheme's tokens continue above the epoch's")
}
