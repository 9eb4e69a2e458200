package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// Deliberately faulty fence and lease paths (test-only code: raw SQL on the
// migrated schema, never shipped), each a mistake one could make writing
// the fenced lock. The history harness of fence_history_test.go must report
// every one of them non-linearizable in at least 19 of 20 runs, with the
// same workload on which the real client passes every run. That is what
// shows that the check can fail, and on which mistakes.
//
// Each faulty statement runs in a READ COMMITTED transaction of its own,
// whatever the session's default isolation: under SERIALIZABLE some of
// these races end in a serialization failure instead of a stale write, and
// the fixture is meant to show the mistake as it behaves in the isolation
// level the library's statements are written for.

// historyRealVariant names the real client among the variants.
const historyRealVariant = "real"

// faultyStore is the real client's store with some of its operations
// replaced.
type faultyStore struct {
	clientStore
	// acquireSQL takes ($1 name, $2 holder, $3 attempt, $4 ttl in µs) and
	// returns (token, acquired_at, expires_at), or no row when the lease
	// is held.
	acquireSQL string
	// renewSQL takes ($1 name, $2 token, $3 ttl in µs), releaseSQL ($1
	// name, $2 token); both return (token, database clock, expires_at),
	// or no row for a lost lease.
	renewSQL, releaseSQL string
	writeFn              func(ctx context.Context, s faultyStore, w historyWrite) error
	// leased, when set, says whether the write path checks the lease.
	leased func(requested bool) bool
}

func (s faultyStore) readCommitted(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

func (s faultyStore) acquire(ctx context.Context, resource, holder string, ttl time.Duration, hold func(context.Context, uint32)) (leaseGrant, error) {
	if s.acquireSQL == "" {
		return s.clientStore.acquire(ctx, resource, holder, ttl, hold)
	}
	var g leaseGrant
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, s.acquireSQL, resource, holder, lease.NewAttempt(), ttl.Microseconds()).Scan(&g.token, &g.at, &g.expires)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s", lease.ErrHeld, resource)
		}
		if err != nil {
			return err
		}
		if hold != nil {
			hold(ctx, tx.Conn().PgConn().PID())
		}
		return nil
	})
	return g, err
}

func (s faultyStore) leaseRow(ctx context.Context, sql string, args ...any) (leaseGrant, error) {
	var g leaseGrant
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, sql, args...).Scan(&g.token, &g.at, &g.expires)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s with token %d", lease.ErrLost, args[0], args[1])
		}
		return err
	})
	return g, err
}

func (s faultyStore) renew(ctx context.Context, resource string, token int64, ttl time.Duration) (leaseGrant, error) {
	if s.renewSQL == "" {
		return s.clientStore.renew(ctx, resource, token, ttl)
	}
	return s.leaseRow(ctx, s.renewSQL, resource, token, ttl.Microseconds())
}

func (s faultyStore) release(ctx context.Context, resource string, token int64) (leaseGrant, error) {
	if s.releaseSQL == "" {
		return s.clientStore.release(ctx, resource, token)
	}
	return s.leaseRow(ctx, s.releaseSQL, resource, token)
}

func (s faultyStore) write(ctx context.Context, w historyWrite) error {
	if s.writeFn == nil {
		return s.clientStore.write(ctx, w)
	}
	return s.writeFn(ctx, s, w)
}

func (s faultyStore) leaseChecked(requested bool) bool {
	if s.leased == nil {
		return requested
	}
	return s.leased(requested)
}

// faultyAcquire builds an acquire statement shaped like queries/lease.sql's
// (one upsert, tokens from the lease sequence, the resource's fence raised
// in the same statement) with the given parts left out or changed.
func faultyAcquire(snapshotCheck, rowGuard bool, takeoverToken string, raise bool) string {
	var b strings.Builder
	b.WriteString(`
WITH c AS (
    SELECT pgquota.clock() AS at, $4::bigint * interval '1 microsecond' AS ttl
), acq AS (
    INSERT INTO pgquota.lease AS l (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
    SELECT $1::text, $2::text, $3::text, nextval('pgquota.lease_token'), c.at, c.at, c.at + c.ttl
    FROM c`)
	if snapshotCheck {
		b.WriteString(`
    WHERE NOT EXISTS (SELECT 1 FROM pgquota.lease x WHERE x.name = $1::text AND x.expires_at > c.at)`)
	}
	b.WriteString(`
    ON CONFLICT (name) DO UPDATE
    SET holder = excluded.holder, attempt = excluded.attempt, token = ` + takeoverToken + `,
        acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at`)
	if rowGuard {
		b.WriteString(`
    WHERE l.expires_at <= pgquota.clock()`)
	}
	b.WriteString(`
    RETURNING l.name, l.token, l.acquired_at, l.expires_at
)`)
	if raise {
		b.WriteString(`, raised AS (
    INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
    SELECT acq.name, acq.token, c.at FROM acq, c
    ON CONFLICT (resource) DO UPDATE SET max_token = excluded.max_token, updated_at = excluded.updated_at
    WHERE f.max_token < excluded.max_token
)`)
	}
	b.WriteString(`
SELECT acq.token, acq.acquired_at, acq.expires_at FROM acq`)
	return b.String()
}

const nextToken = "nextval('pgquota.lease_token')"

// faultyRenew is queries/lease.sql's renew with the given conditions.
func faultyRenew(tokenCond, expiryCond string) string {
	return `
UPDATE pgquota.lease l
SET renewed_at = c.at, expires_at = c.at + c.ttl
FROM (SELECT pgquota.clock() AS at, $3::bigint * interval '1 microsecond' AS ttl) c
WHERE l.name = $1::text AND ` + tokenCond + ` AND ` + expiryCond + `
RETURNING l.token, c.at, l.expires_at`
}

// faultyRelease is queries/lease.sql's release with the given token
// condition.
func faultyRelease(tokenCond string) string {
	return `
UPDATE pgquota.lease l
SET expires_at = least(l.expires_at, c.at)
FROM (SELECT pgquota.clock() AS at) c
WHERE l.name = $1::text AND ` + tokenCond + `
RETURNING l.token, c.at, l.expires_at`
}

// upsertRow writes a fenced row; guarded keeps a row's own token from
// going down (the row as its own fence). It reports whether a row was
// written.
func upsertRow(ctx context.Context, s faultyStore, w historyWrite, guarded bool) (bool, error) {
	sql := `
INSERT INTO pgquota.fenced_row AS r (resource, key, value, fence_token, updated_at)
VALUES ($1, $2, $3, $4, pgquota.clock())
ON CONFLICT (resource, key) DO UPDATE
SET value = excluded.value, fence_token = excluded.fence_token, updated_at = excluded.updated_at`
	if guarded {
		sql += `
WHERE r.fence_token <= excluded.fence_token`
	}
	var n int64
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, w.resource, w.key, w.value, w.token)
		n = tag.RowsAffected()
		return err
	})
	return n == 1, err
}

func pauseIn(w historyWrite) {
	if w.pause != nil {
		w.pause()
	}
}

// historyFault is one faulty path.
type historyFault struct {
	name  string
	store func(base clientStore) faultyStore
}

var historyFaults = []historyFault{
	{
		// The write ignores the token altogether (a plain upsert).
		name: "unfenced-write",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, leased: func(bool) bool { return false },
				writeFn: func(ctx context.Context, s faultyStore, w historyWrite) error {
					pauseIn(w)
					_, err := upsertRow(ctx, s, w, false)
					return err
				}}
		},
	},
	{
		// The fence is kept per key (each row refuses a token below its
		// own) instead of per resource: a successor that wrote the other
		// key, or nothing yet, does not fence the stale holder off.
		name: "fence-per-key",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, leased: func(bool) bool { return false },
				writeFn: func(ctx context.Context, s faultyStore, w historyWrite) error {
					pauseIn(w)
					ok, err := upsertRow(ctx, s, w, true)
					if err == nil && !ok {
						err = fmt.Errorf("%w: row %s holds a higher token", fence.ErrStaleToken, w.key)
					}
					return err
				}}
		},
	},
	{
		// Acquiring does not raise the resource's highest token seen, only
		// writes do: until the successor writes, writes relying on the
		// fence (an external token source, a guarded table) admit the
		// stale holder.
		name: "fence-raised-only-by-writes",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, leased: func(bool) bool { return false },
				acquireSQL: faultyAcquire(true, true, nextToken, false)}
		},
	},
	{
		// The acquire does not check the expiry: it takes a held lease.
		name: "acquire-ignores-expiry",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, acquireSQL: faultyAcquire(false, false, nextToken, true)}
		},
	},
	{
		// The acquire checks the expiry only on the statement's snapshot
		// (NOT EXISTS), not in the WHERE clause of the row it updates: an
		// acquirer that waited for another's uncommitted acquisition takes
		// the lease over it.
		name: "acquire-checks-expiry-in-snapshot",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, acquireSQL: faultyAcquire(true, false, nextToken, true)}
		},
	},
	{
		// A takeover keeps the expired lease's token instead of taking a
		// new one: two holders share a token, and the fence cannot tell
		// them apart.
		name: "takeover-keeps-token",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, acquireSQL: faultyAcquire(true, true, "l.token", true)}
		},
	},
	{
		// The write checks the lease in one statement and writes in the
		// next, without locking the lease row (FOR SHARE) or passing the
		// resource's fence: a takeover slips in between check and write.
		name: "lease-checked-then-written-unlocked",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, leased: func(bool) bool { return true },
				writeFn: func(ctx context.Context, s faultyStore, w historyWrite) error {
					var token int64
					var held bool
					err := s.readCommitted(ctx, func(tx pgx.Tx) error {
						return tx.QueryRow(ctx, `SELECT l.token, l.expires_at > pgquota.clock() FROM pgquota.lease l WHERE l.name = $1`,
							w.resource).Scan(&token, &held)
					})
					switch {
					case err != nil:
						return err
					case token > w.token:
						return fmt.Errorf("%w: lease %s was acquired since", fence.ErrStaleToken, w.resource)
					case token != w.token || !held:
						return fmt.Errorf("%w: lease %s", lease.ErrLost, w.resource)
					}
					pauseIn(w)
					ok, err := upsertRow(ctx, s, w, true)
					if err == nil && !ok {
						err = fmt.Errorf("%w: row %s holds a higher token", fence.ErrStaleToken, w.key)
					}
					return err
				}}
		},
	},
	{
		// Renew is not conditioned on the token: a deposed holder extends
		// its successor's lease.
		name: "renew-ignores-token",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, renewSQL: faultyRenew("$2::bigint IS NOT NULL", "l.expires_at > pgquota.clock()")}
		},
	},
	{
		// Renew does not check the expiry: a lease that lapsed comes back.
		name: "renew-ignores-expiry",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, renewSQL: faultyRenew("l.token = $2::bigint", "true")}
		},
	},
	{
		// Release is not conditioned on the token: a deposed holder ends
		// its successor's lease.
		name: "release-ignores-token",
		store: func(base clientStore) faultyStore {
			return faultyStore{clientStore: base, releaseSQL: faultyRelease("$2::bigint IS NOT NULL")}
		},
	},
}

// historyFaithfulCopy names the control: the raw-SQL acquire, renew and
// release above with none of their conditions left out, which must pass
// every run, so that each fault's detection is owed to what it leaves out.
const historyFaithfulCopy = "faithful-copy"

func faithfulCopy(base clientStore) faultyStore {
	return faultyStore{
		clientStore: base,
		acquireSQL:  faultyAcquire(true, true, nextToken, true),
		renewSQL:    faultyRenew("l.token = $2::bigint", "l.expires_at > pgquota.clock()"),
		releaseSQL:  faultyRelease("l.token = $2::bigint"),
	}
}

// historyStoreFor returns the store of a variant: the real client, the
// faithful copy, or one of historyFaults.
func historyStoreFor(variant string, base clientStore) (historyStore, error) {
	switch variant {
	case historyRealVariant:
		return base, nil
	case historyFaithfulCopy:
		return faithfulCopy(base), nil
	}
	for _, f := range historyFaults {
		if f.name == variant {
			return f.store(base), nil
		}
	}
	return nil, fmt.Errorf("no history variant %q", variant)
}

// Every faulty path is reported non-linearizable in at least 19 of 20 runs
// of the workload on which the real client passes every run.
func TestFenceHistoryReportsFaultyPaths(t *testing.T) {
	t.Parallel()
	s := newHistorySetup(t, 6, 2)
	client, err := quota.New(s.pool, nil)
	require.NoError(t, err)
	base := clientStore{pool: s.pool, client: client}
	results := make([][]historyResult, len(historyFaults))
	var control []historyResult
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		control = s.runs(context.Background(), historyFaithfulCopy, faithfulCopy(base), historyRuns)
	}()
	for i, f := range historyFaults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The faulty statements write pgquota's tables by hand: as the
			// owner (the client's calls stay on the suite's pool).
			store, err := historyStoreFor(f.name, clientStore{pool: s.owner, client: client})
			if err != nil {
				panic(err)
			}
			results[i] = s.runs(context.Background(), f.name, store, historyRuns)
		}()
	}
	wg.Wait()
	t.Run(historyFaithfulCopy, func(t *testing.T) {
		for j, r := range control {
			require.NoError(t, r.err, "run %d", j)
			require.Equal(t, porcupine.Ok, r.check, "run %d of the faithful copy is not linearizable:\n%s", j, describeHistory(r.history))
			require.Empty(t, r.unexpected, "run %d", j)
		}
		t.Logf("%s: linearizable in %d of %d runs", historyFaithfulCopy, len(control), len(control))
	})
	for i, f := range historyFaults {
		t.Run(f.name, func(t *testing.T) {
			detected, unknown := 0, 0
			for j, r := range results[i] {
				require.NoError(t, r.err, "run %d", j)
				switch r.check {
				case porcupine.Illegal:
					detected++
				case porcupine.Unknown:
					unknown++
				}
			}
			t.Logf("%s: reported non-linearizable in %d of %d runs (%d undecided)", f.name, detected, len(results[i]), unknown)
			require.GreaterOrEqual(t, detected, historyRuns-1, "%s must be reported in at least %d of %d runs", f.name, historyRuns-1, historyRuns)
		})
	}
}
