package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// reapScene is a database with leases in every state the reaper tells apart.
type reapScene struct {
	*testBundle
	stale int64 // the token of r-lease's deposed holder
	last  int64 // the token of r-lease's last holder
	// staleGuard is the deposed token of the guarded table's lease.
	staleGuard int64
}

// age moves a lease's times and its fence row's back by d, as if d had
// passed since.
func (b *testBundle) age(t *testing.T, name string, d time.Duration) {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, `
		UPDATE pgquota.lease SET acquired_at = acquired_at - $2::interval, renewed_at = renewed_at - $2::interval,
		                         expires_at = expires_at - $2::interval WHERE name = $1;
		`, name, d)
	require.NoError(t, err)
	_, err = b.owner.Exec(b.ctx, `UPDATE pgquota.fence SET updated_at = updated_at - $2::interval WHERE resource = $1`, name, d)
	require.NoError(t, err)
}

// depose acquires name as "deposed", ends that lease as an operator would,
// has "last" acquire and release it, and returns both tokens.
func (b *testBundle) depose(t *testing.T, name string) (stale, last int64) {
	t.Helper()
	a := b.acquire(t, name, "deposed", time.Minute)
	_, err := b.owner.Exec(b.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() WHERE name = $1`, name)
	require.NoError(t, err)
	l := b.acquire(t, name, "last", time.Minute)
	_, err = b.leases.Release(b.ctx, lease.Lease{Name: name, Token: l.Token})
	require.NoError(t, err)
	return a.Token, l.Token
}

func newReapScene(t *testing.T) *reapScene {
	t.Helper()
	s := &reapScene{testBundle: setup(t, 0)}
	s.stale, s.last = s.depose(t, "r-lease")
	s.appDDL(t, `CREATE TABLE public.reports (id int PRIMARY KEY, val text, tok bigint)`, nil, "public.reports")
	_, err := fenceOf(t, s.ownerClient(t)).GuardTable(s.ctx, fence.GuardTableRequest{Table: "public.reports", Column: "tok"})
	require.NoError(t, err)
	s.staleGuard, _ = s.depose(t, "public.reports")
	s.acquire(t, "held", "h", time.Minute)
	recent := s.acquire(t, "recent", "h", time.Minute)
	_, err = leaseOf(t, s.client).Release(s.ctx, lease.Lease{Name: "recent", Token: recent.Token})
	require.NoError(t, err)
	// bumped: an external token source wrote above the lease's tokens.
	_, bumpedLast := s.depose(t, "bumped")
	_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "bumped", Key: "k", Value: "v", Token: bumpedLast + 1000})
	require.NoError(t, err)
	// ext: fenced with external tokens only, no lease.
	_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "ext", Key: "k", Value: "v", Token: 7})
	require.NoError(t, err)
	for _, n := range []string{"r-lease", "public.reports", "bumped", "ext", "held"} {
		s.age(t, n, 2*time.Hour)
	}
	// held is still held: its expiry was a minute ahead, moved back two
	// hours it is expired; renew-by-SQL keeps it held for the test.
	_, err = s.owner.Exec(s.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() + interval '1 minute' WHERE name = 'held'`)
	require.NoError(t, err)
	return s
}

func (s *reapScene) leaseNames(t *testing.T) []string {
	t.Helper()
	var out []string
	rows, err := s.pool.Query(s.ctx, `SELECT name FROM pgquota.lease ORDER BY name`)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

func (s *reapScene) fenceNames(t *testing.T) []string {
	t.Helper()
	var out []string
	rows, err := s.pool.Query(s.ctx, `SELECT resource FROM pgquota.fence ORDER BY resource`)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

func reapedNames(r []lease.Reaped) (names []string, fences []string) {
	for _, x := range r {
		names = append(names, x.Name)
		if x.FenceDeleted {
			fences = append(fences, x.Name)
		}
	}
	sort.Strings(names)
	sort.Strings(fences)
	return names, fences
}

// staleWritesRejected checks that the deposed holders' writes do not land,
// through every path: naming the lease, fence only, and a guarded table.
func (s *reapScene) staleWritesRejected(t *testing.T, leaseErr error) {
	t.Helper()
	_, err := fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "stale", Token: s.stale, Lease: "r-lease"})
	require.ErrorIs(t, err, leaseErr, "a stale write naming the lease")
	// The guarded table: presenting the stale token is refused (its lease is
	// not held with it, or was taken over), and so is a statement whose
	// transaction set the token by hand, against the kept highest token.
	err = pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(s.ctx, `SELECT pgquota.present_token('public.reports', $1)`, s.staleGuard); err != nil {
			return fence.MapError(err)
		}
		_, err := tx.Exec(s.ctx, `INSERT INTO public.reports VALUES (1, 'stale', NULL)`)
		return fence.MapError(err)
	})
	require.True(t, errors.Is(err, fence.ErrStaleToken) || errors.Is(err, lease.ErrLost),
		"presenting the stale token to the guarded table is refused, got %v", err)
	err = pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(s.ctx, `SELECT set_config('pgquota.fence_tokens', json_build_object('public.reports', $1::bigint)::text, true)`, s.staleGuard); err != nil {
			return err
		}
		_, err := tx.Exec(s.ctx, `INSERT INTO public.reports VALUES (1, 'stale', NULL)`)
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a stale write to the guarded table")
	// Set by hand, the token carries no proof of presentation.
	require.Equal(t, fence.SQLStateTokenNotPresented, pgErr.Code)
	var n int
	require.NoError(t, s.pool.QueryRow(s.ctx, `SELECT count(*) FROM public.reports`).Scan(&n))
	require.Zero(t, n, "no stale row landed in the guarded table")
	_, err = fenceOf(t, s.client).Row(s.ctx, "r-lease", "k")
	require.ErrorIs(t, err, fence.ErrRowNotFound, "nothing landed")
}

func TestReapLeasesKeepsFencesByDefault(t *testing.T) {
	t.Parallel()
	s := newReapScene(t)

	reaped, err := leaseOf(t, s.operator).Reap(s.ctx, lease.ReapRequest{OlderThan: time.Hour})
	require.NoError(t, err)
	got, fences := reapedNames(reaped)
	require.Equal(t, []string{"bumped", "public.reports", "r-lease"}, got)
	require.Empty(t, fences)
	require.Equal(t, []string{"held", "recent"}, s.leaseNames(t), "held and recently expired leases stay")
	require.Equal(t, []string{"bumped", "ext", "held", "public.reports", "r-lease", "recent"}, s.fenceNames(t), "every fence row stays")

	// The deposed holder of r-lease: naming the lease it finds no row; fence
	// only, the kept fence row rejects it.
	s.staleWritesRejected(t, lease.ErrLost)
	_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "stale", Token: s.stale})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	_, err = leaseOf(t, s.client).Renew(s.ctx, lease.Lease{Name: "r-lease", Token: s.last}, time.Minute)
	require.ErrorIs(t, err, lease.ErrLost)

	// The next acquisition gets a larger token, and the stale holder stays
	// out.
	next := s.acquire(t, "r-lease", "next", time.Minute)
	require.Greater(t, next.Token, s.last)
	_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "stale", Token: s.stale, Lease: "r-lease"})
	require.ErrorIs(t, err, fence.ErrStaleToken)
	_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "next", Token: next.Token, Lease: "r-lease"})
	require.NoError(t, err)

	// Nothing left to reap.
	again, err := leaseOf(t, s.operator).Reap(s.ctx, lease.ReapRequest{OlderThan: time.Hour})
	require.NoError(t, err)
	require.Empty(t, again)
}

func TestReapLeasesWithFencesKeepsGuardedAndExternal(t *testing.T) {
	t.Parallel()
	s := newReapScene(t)

	reaped, err := leaseOf(t, s.operator).Reap(s.ctx, lease.ReapRequest{OlderThan: time.Hour, Fences: true})
	require.NoError(t, err)
	got, fences := reapedNames(reaped)
	require.Equal(t, []string{"bumped", "public.reports", "r-lease"}, got)
	require.Equal(t, []string{"r-lease"}, fences, "only the fence row of a lease-only resource goes")
	require.Equal(t, []string{"held", "recent"}, s.leaseNames(t))
	require.Equal(t, []string{"bumped", "ext", "held", "public.reports", "recent"}, s.fenceNames(t),
		"kept: a guarded table's, one raised by an external token, an external-only one, and those of live leases")

	s.staleWritesRejected(t, lease.ErrLost)

	next := s.acquire(t, "r-lease", "next", time.Minute)
	require.Greater(t, next.Token, s.last, "tokens come from one sequence")
	for _, leaseName := range []string{"r-lease", ""} {
		_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "stale", Token: s.stale, Lease: leaseName})
		require.ErrorIs(t, err, fence.ErrStaleToken, "lease %q", leaseName)
		_, err = fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "stale", Token: s.last, Lease: leaseName})
		require.ErrorIs(t, err, fence.ErrStaleToken, "lease %q", leaseName)
	}
	row, err := fenceOf(t, s.client).WriteRow(s.ctx, fence.WriteRowRequest{Resource: "r-lease", Key: "k", Value: "next", Token: next.Token, Lease: "r-lease"})
	require.NoError(t, err)
	require.Equal(t, "next", row.Value)
}

func TestReapLeasesSkipsWhatIsLocked(t *testing.T) {
	t.Parallel()
	s := newReapScene(t)

	// A fenced writer holds r-lease's fence row; a transaction holds the
	// advisory lock acquirers take on public.reports (as the owner: FOR
	// UPDATE needs UPDATE on the table).
	tx, err := s.owner.Begin(s.ctx)
	require.NoError(t, err)
	defer tx.Rollback(s.ctx)
	_, err = tx.Exec(s.ctx, `SELECT 1 FROM pgquota.fence WHERE resource = 'r-lease' FOR UPDATE`)
	require.NoError(t, err)
	_, err = tx.Exec(s.ctx, `SELECT pg_advisory_xact_lock(hashtextextended('pgquota.lease:' || 'public.reports', 0))`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	reaped, err := leaseOf(t, s.operator).Reap(ctx, lease.ReapRequest{OlderThan: time.Hour, Fences: true})
	require.NoError(t, err, "the reaper waits for nobody")
	got, fences := reapedNames(reaped)
	require.Equal(t, []string{"bumped", "r-lease"}, got)
	require.Empty(t, fences, "r-lease's fence row was locked: kept")
	require.NoError(t, tx.Rollback(s.ctx))

	reaped, err = leaseOf(t, s.operator).Reap(s.ctx, lease.ReapRequest{OlderThan: time.Hour, Fences: true, Limit: 1})
	require.NoError(t, err)
	got, _ = reapedNames(reaped)
	require.Equal(t, []string{"public.reports"}, got, "skipped before, reaped now")
}

func TestReapLeasesRejectsBadInputDeletingNothing(t *testing.T) {
	t.Parallel()
	s := newReapScene(t)
	for _, tc := range []struct {
		req   lease.ReapRequest
		field string
	}{
		{lease.ReapRequest{OlderThan: -time.Hour}, "older than"},
		{lease.ReapRequest{}, "older than"},
		{lease.ReapRequest{OlderThan: 30 * time.Second}, "older than"},
		{lease.ReapRequest{OlderThan: time.Hour, Limit: -1}, "limit"},
	} {
		_, err := leaseOf(t, s.operator).Reap(s.ctx, tc.req)
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, tc.field, ie.Field)
	}
	require.Len(t, s.leaseNames(t), 5, "nothing deleted")
	require.Len(t, s.fenceNames(t), 6)
}

// TestReapLeasesRacingAcquirers runs the reaping statement with no age
// limit while acquirers take, write under and release a few leases: every
// holder's token is larger than its predecessor's, and every write a holder
// makes under its lease lands.
func TestReapLeasesRacingAcquirers(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx, cancel := context.WithTimeout(b.ctx, 1500*time.Millisecond)
	defer cancel()

	var mu sync.Mutex
	tokens := map[string][]int64{} // per lease, in the order holders held it
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("job-%d", i%2)
			for ctx.Err() == nil {
				err := b.leases.Do(ctx, lease.DoRequest{Name: name, Holder: "h", TTL: time.Second, Wait: true},
					func(ctx context.Context) error {
						l, _ := lease.FromContext(ctx)
						mu.Lock()
						tokens[name] = append(tokens[name], l.Token)
						mu.Unlock()
						_, err := b.fences.WriteRow(ctx, fence.WriteRowRequest{Resource: name, Key: "k", Value: "v", Token: l.Token, Lease: name})
						return err
					})
				if err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}
	var reapedRows int
	wg.Add(1)
	go func() {
		defer wg.Done()
		q := db.New()
		for ctx.Err() == nil {
			rows, err := q.LeaseReap(ctx, b.operator.Pool(), db.LeaseReapParams{OlderThanUs: 0, BatchSize: 100, Fences: true})
			if err != nil && ctx.Err() == nil && !quota.IsRetryable(err) {
				errs <- err
				return
			}
			reapedRows += len(rows)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			require.NoError(t, err)
		}
	}
	require.Positive(t, reapedRows, "the reaper deleted rows while acquirers ran")
	for name, ts := range tokens {
		require.Greater(t, len(ts), 3, name)
		for i := 1; i < len(ts); i++ {
			require.Greater(t, ts[i], ts[i-1], "%s: holder %d's token", name, i)
		}
	}
	t.Logf("reaped %d lease rows; holders: %d and %d", reapedRows, len(tokens["job-0"]), len(tokens["job-1"]))
}
