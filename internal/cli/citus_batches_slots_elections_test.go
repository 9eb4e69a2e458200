//go:build citus

package cli_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cituscluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// On a Citus coordinator with two workers, through the Go API of two
// Clients (replicas) on one pool each: batches (keyed too, and two
// batches in opposite orders at once), the default group commit across
// calendar, rate and rolling quotas, coalescing, compensation, semaphores,
// elections and a guarded table give exactly what one PostgreSQL gives.
func TestCitusBatchesGroupCommitSlotsElectionsAndGuardAreExact(t *testing.T) {
	c := cituscluster.Start(t, 2)
	ok(t, c.URL(), "migrate", "up")
	ctx := t.Context()
	newClient := func(cfg *quota.Config) *quota.Client {
		qc, err := quota.New(c.Pool(), cfg)
		require.NoError(t, err)
		return qc
	}
	a, b := newClient(nil), newClient(nil)
	for _, d := range []quota.Definition{
		{Name: "day", Window: quota.WindowDay, DefaultLimit: quota.Limit(5)},
		{Name: "rate", Window: quota.WindowRate, DefaultLimit: quota.Limit(5), Period: time.Hour},
		{Name: "roll", Window: quota.WindowRolling, DefaultLimit: quota.Limit(5), Period: time.Hour},
	} {
		_, err := a.DefineQuota(ctx, d)
		require.NoError(t, err)
	}
	used := func(q, m string) int64 {
		t.Helper()
		u, err := a.Usage(ctx, q, m)
		require.NoError(t, err)
		return u.Used
	}

	t.Run("batch", func(t *testing.T) {
		// 8 requests per member and quota in one batch: the first 5 of
		// each counter are granted, in order.
		var reqs []quota.GrantRequest
		for i := range 24 {
			q := []string{"day", "rate"}[i%2]
			reqs = append(reqs, quota.GrantRequest{Quota: q, Member: fmt.Sprintf("b%d", i%3), Amount: 1})
		}
		reqs = append(reqs, reqs...)
		outs, err := a.GrantBatch(ctx, reqs)
		require.NoError(t, err)
		granted := map[string]int{}
		for _, o := range outs {
			require.NoError(t, o.Err)
			if o.Granted {
				granted[o.Quota+"/"+o.Member]++
			}
		}
		for _, q := range []string{"day", "rate"} {
			for m := range 3 {
				k := fmt.Sprintf("%s/b%d", q, m)
				require.Equal(t, 5, granted[k], k)
			}
		}
		for m := range 3 {
			require.EqualValues(t, 5, used("day", fmt.Sprintf("b%d", m)), "the counter holds what was granted")
		}
	})

	t.Run("keyed batch replays", func(t *testing.T) {
		reqs := []quota.GrantRequest{
			{Quota: "day", Member: "k", Amount: 2, Idempotency: quota.IdempotencyKey{Key: "k1"}},
			{Quota: "day", Member: "k", Amount: 2, Idempotency: quota.IdempotencyKey{Key: "k2"}},
			{Quota: "day", Member: "k", Amount: 2, Idempotency: quota.IdempotencyKey{Key: "k3"}},
		}
		first, err := a.GrantBatch(ctx, reqs)
		require.NoError(t, err)
		again, err := b.GrantBatch(ctx, reqs)
		require.NoError(t, err)
		for i := range reqs {
			require.NoError(t, first[i].Err)
			require.NoError(t, again[i].Err)
			require.Equal(t, i < 2, first[i].Granted, "request %d", i)
			require.Equal(t, first[i].Granted, again[i].Granted)
			require.True(t, again[i].Keyed.Replayed, "request %d", i)
		}
		require.EqualValues(t, 4, used("day", "k"))
	})

	t.Run("batches in opposite orders", func(t *testing.T) {
		var members []string
		for i := range 6 {
			members = append(members, fmt.Sprintf("o%d", i))
		}
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for r := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				order := slices.Clone(members)
				if r%2 == 1 {
					slices.Reverse(order)
				}
				var reqs []quota.GrantRequest
				for _, m := range order {
					reqs = append(reqs, quota.GrantRequest{Quota: "day", Member: m, Amount: 1})
				}
				cl := []*quota.Client{a, b}[r%2]
				outs, err := cl.GrantBatch(ctx, reqs)
				if err == nil {
					for _, o := range outs {
						err = errors.Join(err, o.Err)
					}
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for _, m := range members {
			require.EqualValues(t, 5, used("day", m), m)
		}
	})

	t.Run("group commit and coalescing", func(t *testing.T) {
		co := newClient(&quota.Config{Grouping: quota.GroupByCounter})
		clients := []*quota.Client{a, b, co}
		var mu sync.Mutex
		granted := map[string]int{}
		var wg sync.WaitGroup
		for i := range 90 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q := []string{"day", "rate", "roll"}[i%3]
				r, err := clients[(i/3)%3].Grant(ctx, quota.GrantRequest{Quota: q, Member: "hot", Amount: 1})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("grant %d: %v", i, err)
				} else if r.Granted {
					granted[q]++
				}
			}()
		}
		wg.Wait()
		require.Equal(t, map[string]int{"day": 5, "rate": 5, "roll": 5}, granted)
		require.EqualValues(t, 5, used("day", "hot"))
	})

	t.Run("compensation gives back once", func(t *testing.T) {
		g, err := a.Grant(ctx, quota.GrantRequest{Quota: "day", Member: "comp", Amount: 3, Idempotency: quota.IdempotencyKey{Key: "c1"}})
		require.NoError(t, err)
		require.True(t, g.Granted)
		var wg sync.WaitGroup
		var mu sync.Mutex
		fresh := 0
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := []*quota.Client{a, b}[i%2].CompensateGrant(ctx, g.Keyed.GrantID)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("compensate %d: %v", i, err)
					return
				}
				require.EqualValues(t, 3, r.Revoked)
				if !r.Replayed {
					fresh++
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, fresh, "one compensation gives the units back")
		require.EqualValues(t, 0, used("day", "comp"))
	})

	la, err := lease.New(a)
	require.NoError(t, err)
	lb, err := lease.New(b)
	require.NoError(t, err)

	t.Run("semaphore", func(t *testing.T) {
		var mu sync.Mutex
		var taken []lease.Slot
		full := 0
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := []*lease.Client{la, lb}[i%2].AcquireSlot(ctx, lease.SlotRequest{Semaphore: "sem", Limit: 2, Holder: fmt.Sprintf("h%d", i), TTL: time.Minute})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, lease.ErrSemaphoreFull):
					full++
				case err != nil:
					t.Errorf("acquire slot %d: %v", i, err)
				default:
					taken = append(taken, s)
				}
			}()
		}
		wg.Wait()
		require.Len(t, taken, 2)
		require.Equal(t, 10, full)
		st, err := la.Semaphore(ctx, "sem")
		require.NoError(t, err)
		require.Equal(t, 2, st.Held)
		require.Len(t, st.Holders(), 2)

		_, err = la.Acquire(ctx, lease.AcquireRequest{Name: taken[0].Name, Holder: "sneak", TTL: time.Minute})
		require.Error(t, err, "a slot's lease is not taken through the lease API")
		require.Contains(t, err.Error(), "is a semaphore slot")

		_, err = lb.ReleaseSlot(ctx, taken[0])
		require.NoError(t, err)
		next, err := lb.AcquireSlot(ctx, lease.SlotRequest{Semaphore: "sem", Limit: 2, Holder: "next", TTL: time.Minute})
		require.NoError(t, err)
		require.Greater(t, next.Token, max(taken[0].Token, taken[1].Token), "a slot taken again gets a higher token")
	})

	t.Run("election", func(t *testing.T) {
		ea, err := la.NewElection("leader", lease.ElectionOptions{Holder: "a", TTL: 3 * time.Second})
		require.NoError(t, err)
		eb, err := lb.NewElection("leader", lease.ElectionOptions{Holder: "b", TTL: 3 * time.Second})
		require.NoError(t, err)
		lead, err := ea.Campaign(ctx, "http://a")
		require.NoError(t, err)
		got, err := eb.Leader(ctx)
		require.NoError(t, err)
		require.Equal(t, "a", got.Holder)
		require.Equal(t, "http://a", got.Payload)

		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = eb.Campaign(cctx, "http://b")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "b waits while a leads")
		require.NoError(t, lead.Resign(ctx))
		leadB, err := eb.Campaign(ctx, "http://b")
		require.NoError(t, err)
		require.Greater(t, leadB.Lease().Token, lead.Lease().Token)
		require.NoError(t, leadB.Resign(ctx))
	})

	t.Run("guarded table", func(t *testing.T) {
		_, err := c.Pool().Exec(ctx, `CREATE TABLE public.reports (id int PRIMARY KEY, status text, fence_token bigint)`)
		require.NoError(t, err)
		fa, err := fence.New(a)
		require.NoError(t, err)
		g, err := fa.GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
		require.NoError(t, err)
		first, err := la.Acquire(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "one", TTL: 200 * time.Millisecond})
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		second, err := lb.Acquire(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "two", TTL: time.Minute})
		require.NoError(t, err)
		write := func(token int64, status string) error {
			return fa.RunTx(ctx, fence.TxRequest{Resource: g.Resource, Token: token}, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO public.reports (id, status) VALUES (1, $1)
					ON CONFLICT (id) DO UPDATE SET status = excluded.status`, status)
				return err
			})
		}
		require.NoError(t, write(second.Token, "new"))
		require.ErrorIs(t, write(first.Token, "stale"), fence.ErrStaleToken)
		var status string
		var token int64
		require.NoError(t, c.Pool().QueryRow(ctx, `SELECT status, fence_token FROM public.reports WHERE id = 1`).Scan(&status, &token))
		require.Equal(t, "new", status)
		require.Equal(t, second.Token, token)
	})
}
