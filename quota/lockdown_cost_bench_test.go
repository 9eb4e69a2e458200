package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// The lease statements as the caller ran them before migration 00022 made
// them SECURITY DEFINER functions (db/lease.sql.go at 88151e5).
const (
	inlineLeaseAcquire = `-- name: LeaseAcquire :many
WITH c AS (
    SELECT pgquota.clock() AS at, $1::interval AS ttl, pgquota.durable_commit() AS durable
), inserted_at AS (
    SELECT pgquota.clock() AS at
), taken_at AS (
    SELECT pgquota.clock() AS at
), acq AS (
    INSERT INTO pgquota.lease AS l (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
    SELECT $2::text, $3::text, $4::text,
           (SELECT pgquota.next_lease_token()
            FROM pg_advisory_xact_lock(hashtextextended('pgquota.lease:' || $2::text, 0))),
           (SELECT at FROM inserted_at), (SELECT at FROM inserted_at), (SELECT at FROM inserted_at) + c.ttl
    FROM c
    WHERE NOT EXISTS (
        SELECT 1 FROM pgquota.lease x
        WHERE x.name = $2::text AND x.expires_at > c.at AND x.attempt <> $4::text
    )
    ON CONFLICT (name) DO UPDATE
    SET holder      = excluded.holder,
        attempt     = excluded.attempt,
        token       = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.token ELSE pgquota.next_lease_token() END,
        acquired_at = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.acquired_at ELSE (SELECT at FROM taken_at) END,
        renewed_at  = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.renewed_at ELSE (SELECT at FROM taken_at) END,
        expires_at  = CASE WHEN l.expires_at > (SELECT at FROM taken_at) THEN l.expires_at ELSE (SELECT at FROM taken_at) + $1::interval END
    WHERE l.expires_at <= (SELECT at FROM taken_at) OR l.attempt = excluded.attempt
    RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, pgquota.clock() AS db_now
), raised AS (
    INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
    SELECT acq.name, acq.token, c.at
    FROM acq, c
    ON CONFLICT (resource) DO UPDATE
    SET max_token  = excluded.max_token,
        updated_at = excluded.updated_at
    WHERE f.max_token < excluded.max_token
)
SELECT true AS taken, acq.name, acq.holder, acq.attempt, acq.token, acq.acquired_at, acq.renewed_at, acq.expires_at, acq.db_now
FROM acq
UNION ALL
SELECT false AS taken, f.name, f.holder, f.attempt, f.token, f.acquired_at, f.renewed_at, f.expires_at, pgquota.clock() AS db_now
FROM pgquota.lease_fresh($2::text) f
WHERE NOT EXISTS (SELECT 1 FROM acq)
`
	inlineLeaseRelease = `-- name: LeaseRelease :one
UPDATE pgquota.lease l
SET expires_at = least(l.expires_at, c.at)
FROM (SELECT pgquota.clock() AS at) c
WHERE l.name = $1::text
  AND l.token = $2::bigint
  AND pgquota.durable_commit()
RETURNING l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now,
          pgquota.lease_notify_waiters(l.name) AS notified
`
)

// BenchmarkLockdownCost measures what running the API's statements inside
// SECURITY DEFINER functions with a pinned search_path costs, one client,
// in one run: a lease acquire and release as the inline statements (the
// schema owner, as before) and as the functions (a pgquota_app login); a
// grant with pgquota.grant SECURITY INVOKER (as before) and SECURITY
// DEFINER.
//
//	go test ./quota -run '^$' -bench LockdownCost -benchtime 3s
func BenchmarkLockdownCost(b *testing.B) {
	ctx := context.Background()
	dbURL := pgtest.NewURL(b)
	owner := pgtest.ConnectOwner(b, dbURL, 1)
	app := pgtest.Connect(b, pgtest.AppURL(b, dbURL), 1)
	op, err := quota.New(pgtest.Connect(b, pgtest.OperatorURL(b, dbURL), 1), nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := op.DefineQuota(ctx, quota.Definition{Name: "bench", Window: quota.WindowDay}); err != nil {
		b.Fatal(err)
	}
	ttl := pgtype.Interval{Microseconds: int64(time.Minute / time.Microsecond), Valid: true}
	q := db.New()
	b.Run("lease/statement", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var token int64
			rows, err := owner.Query(ctx, inlineLeaseAcquire, ttl, "bench-lease", "h", "a")
			if err == nil {
				for rows.Next() {
					vals, _ := rows.Values()
					token = vals[4].(int64)
				}
				rows.Close()
				err = rows.Err()
			}
			if err == nil {
				_, err = owner.Exec(ctx, inlineLeaseRelease, "bench-lease", token)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lease/function", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rows, err := q.LeaseAcquire(ctx, app, db.LeaseAcquireParams{Ttl: ttl, Name: "bench-lease", Holder: "h", Attempt: "a"})
			if err == nil {
				_, err = q.LeaseRelease(ctx, app, db.LeaseReleaseParams{Name: "bench-lease", Token: rows[0].Token})
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	grant := func(b *testing.B, pool *pgxpool.Pool) {
		for i := 0; i < b.N; i++ {
			if _, err := pool.Exec(ctx, `SELECT * FROM pgquota.grant('bench', 'm', 1)`); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("grant/definer", func(b *testing.B) { grant(b, app) })
	b.Run("grant/invoker", func(b *testing.B) {
		if _, err := owner.Exec(ctx, `ALTER FUNCTION pgquota.grant(text, text, bigint, bigint) SECURITY INVOKER RESET search_path`); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_, _ = owner.Exec(ctx, `SELECT pgquota.grant_roles()`)
		})
		grant(b, owner)
	})
}
