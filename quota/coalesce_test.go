package quota_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// coalescing returns a client with Config.Coalesce on b's pool.
func (b *testBundle) coalescing(t *testing.T, cfg quota.Config) *quota.Client {
	t.Helper()
	cfg.Grouping = quota.GroupByCounter
	c, err := quota.New(b.pool, &cfg)
	require.NoError(t, err)
	return c
}

// checkChain checks that results (of one counter, any order) are the
// outcomes of running the calls one after another in some order, starting
// from a counter at 0: the granted calls' Used values form the chain
// a1, a1+a2, ... (each granted call's Used minus its Amount is the Used of
// the one before), every denied call reports a value of that chain at
// which its amount did not fit, and the chain ends at final.
func checkChain(t *testing.T, results []quota.GrantResult, final int64) {
	t.Helper()
	var granted []quota.GrantResult
	for _, r := range results {
		if r.Granted {
			granted = append(granted, r)
		}
	}
	sort.Slice(granted, func(i, j int) bool { return granted[i].Used < granted[j].Used })
	points := map[int64]bool{0: true}
	prev := int64(0)
	for _, r := range granted {
		require.Equal(t, prev, r.Used-r.Amount, "granted calls form one chain of counter values")
		require.LessOrEqual(t, r.Used, r.Limit)
		prev = r.Used
		points[prev] = true
	}
	require.Equal(t, final, prev, "the counter is the sum of the granted amounts")
	for _, r := range results {
		if !r.Granted {
			require.True(t, points[r.Used], "a denied call reports a counter value of the chain, got %d", r.Used)
			require.Greater(t, r.Used+r.Amount, r.Limit, "a denied call did not fit")
		}
	}
}

func TestCoalesceHotRow512(t *testing.T) {
	t.Parallel()
	const (
		callers = 512
		limit   = 300
	)
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](limit)})
	var statements, decided atomic.Int64
	c := b.coalescing(t, quota.Config{})
	quota.SetCoalesceSend(c, func(n int) {
		statements.Add(1)
		decided.Add(int64(n))
	})

	results := make([]quota.GrantResult, callers)
	errs := make([]error, callers)
	concurrently(callers, func(i int) {
		results[i], errs[i] = c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "hot", Amount: 1})
	})
	var used []int64
	for i, r := range results {
		require.NoError(t, errs[i])
		if r.Granted {
			used = append(used, r.Used)
		} else {
			require.Equal(t, int64(limit), r.Used, "a denial reports the full counter")
			require.Zero(t, r.Remaining)
		}
	}
	require.Len(t, used, limit, "exactly the limit is granted")
	slices.Sort(used)
	for i, u := range used {
		require.Equal(t, int64(i+1), u, "the used values of granted calls are exactly 1..%d", limit)
	}
	sum, rows := b.usageRows(t, "q", "hot")
	require.Equal(t, int64(limit), sum)
	require.Equal(t, int64(1), rows)
	require.Equal(t, int64(callers), decided.Load(), "every call was decided by exactly one statement")
	t.Logf("%d calls in %d statements", callers, statements.Load())
}

func TestCoalesceSequentialSemantics(t *testing.T) {
	t.Parallel()
	// Amounts of 1..5 on a few members, with and without a call's limit:
	// every counter's outcomes must be those of a sequential run.
	const callers = 300
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](60)})
	c := b.coalescing(t, quota.Config{})
	members := []string{"a", "b", "c"}
	results := make([]quota.GrantResult, callers)
	errs := make([]error, callers)
	concurrently(callers, func(i int) {
		req := quota.GrantRequest{Quota: "q", Member: members[i%len(members)], Amount: int64(i%5 + 1)}
		results[i], errs[i] = c.Grant(b.ctx, req)
	})
	for _, m := range members {
		var mine []quota.GrantResult
		for i, r := range results {
			require.NoError(t, errs[i])
			if r.Member == m {
				mine = append(mine, r)
			}
		}
		sum, _ := b.usageRows(t, "q", m)
		require.LessOrEqual(t, sum, int64(60))
		checkChain(t, mine, sum)
	}
}

func TestCoalesceDifferentLimitsOneCounter(t *testing.T) {
	t.Parallel()
	// Calls with different limits queue apart and race on the same row:
	// the row's guard still holds each call's own limit.
	const callers = 200
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone})
	c := b.coalescing(t, quota.Config{})
	results := make([]quota.GrantResult, callers)
	errs := make([]error, callers)
	concurrently(callers, func(i int) {
		results[i], errs[i] = c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: ptr(int64(40 + 40*(i%2)))})
	})
	granted := int64(0)
	for i, r := range results {
		require.NoError(t, errs[i])
		if r.Granted {
			granted++
			require.LessOrEqual(t, r.Used, r.Limit)
		} else {
			require.Greater(t, r.Used+1, r.Limit)
		}
	}
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, granted, sum)
	require.Equal(t, int64(80), sum, "the calls with limit 80 fill the counter")
	checkChain(t, results, sum)
}

func TestCoalesceErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "nolimit", Window: quota.WindowDay})
	c := b.coalescing(t, quota.Config{})

	_, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "", Member: "m", Amount: 1})
	var ie *quota.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "quota name", ie.Field)
	_, err = c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 0})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "amount", ie.Field)
	_, err = c.Grant(b.ctx, quota.GrantRequest{Quota: "missing", Member: "m", Amount: 1})
	require.ErrorIs(t, err, quota.ErrQuotaNotFound)
	_, err = c.Grant(b.ctx, quota.GrantRequest{Quota: "nolimit", Member: "m", Amount: 1})
	require.ErrorIs(t, err, quota.ErrNoLimit)
	require.Zero(t, b.countRows(t, "usage"), "nothing written")

	cancelled, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err = c.Grant(cancelled, quota.GrantRequest{Quota: "nolimit", Member: "m", Amount: 1, Limit: ptr[int64](5)})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, quota.ErrGrantAbandoned)
	require.Zero(t, b.countRows(t, "usage"), "nothing written")

	res, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "nolimit", Member: "m", Amount: 3, Limit: ptr[int64](5)})
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, int64(3), res.Used)
	require.Equal(t, int64(2), res.Remaining)
	require.False(t, res.WindowEnd.IsZero())
}

func TestCoalesceCancelBeforeAndAfterSend(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)})

	var mu sync.Mutex
	var abandoned []quota.GrantResult
	c := b.coalescing(t, quota.Config{OnAbandonedGrant: func(_ quota.GrantRequest, res quota.GrantResult, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("abandoned call: %v", err)
		}
		abandoned = append(abandoned, res)
	}})
	// Each statement waits for a release, so the test decides what is
	// queued and what is sent.
	sent := make(chan int, 10)
	release := make(chan struct{})
	quota.SetCoalesceSend(c, func(n int) {
		sent <- n
		<-release
	})
	grant := func(ctx context.Context) (quota.GrantResult, error) {
		return c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	}

	type outcome struct {
		res quota.GrantResult
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := grant(b.ctx)
		first <- outcome{res, err}
	}()
	require.Equal(t, 1, <-sent, "the first call goes alone")

	// 20 calls queue behind the first statement.
	const queued = 20
	ctxs := make([]context.Context, queued)
	cancels := make([]context.CancelFunc, queued)
	outs := make([]chan outcome, queued)
	for i := range queued {
		ctxs[i], cancels[i] = context.WithCancel(b.ctx)
		defer cancels[i]()
		outs[i] = make(chan outcome, 1)
		go func() {
			res, err := grant(ctxs[i])
			outs[i] <- outcome{res, err}
		}()
	}
	waitFor(t, "20 queued calls", func() bool { return quota.CoalesceQueued(c, "q", "m") == queued })

	// The first 8 give up before they are sent: nothing is granted to them.
	for i := range 8 {
		cancels[i]()
		o := <-outs[i]
		require.ErrorIs(t, o.err, context.Canceled)
		require.NotErrorIs(t, o.err, quota.ErrGrantAbandoned)
	}
	require.Equal(t, queued-8, quota.CoalesceQueued(c, "q", "m"))

	release <- struct{}{}
	o := <-first
	require.NoError(t, o.err)
	require.True(t, o.res.Granted)
	require.Equal(t, int64(1), o.res.Used)

	// The other 12 go in the second statement; 5 of them give up after
	// it was sent.
	require.Equal(t, queued-8, <-sent)
	for i := 8; i < 13; i++ {
		cancels[i]()
		o := <-outs[i]
		require.ErrorIs(t, o.err, quota.ErrGrantAbandoned)
		require.ErrorIs(t, o.err, context.Canceled)
	}
	close(release)
	var results []quota.GrantResult
	results = append(results, o.res)
	for i := 13; i < queued; i++ {
		o := <-outs[i]
		require.NoError(t, o.err)
		require.True(t, o.res.Granted)
		results = append(results, o.res)
	}
	waitFor(t, "5 abandoned outcomes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(abandoned) == 5
	})
	mu.Lock()
	results = append(results, abandoned...)
	mu.Unlock()
	for _, r := range results[1:] {
		require.True(t, r.Granted)
	}
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, int64(1+12), sum, "the counter holds the first call and the 12 sent ones, not the 8 cancelled before")
	checkChain(t, results, sum)
}

func TestCoalesceCancelRandom(t *testing.T) {
	t.Parallel()
	// Callers give up at random moments, before or after their call is
	// sent: the counter must equal the units reported granted, to callers
	// or to OnAbandonedGrant, and no unit is reported twice.
	const callers = 400
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](250)})
	var mu sync.Mutex
	var results []quota.GrantResult
	var abandoned, cancelledUnsent int
	record := func(r quota.GrantResult) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
	}
	c := b.coalescing(t, quota.Config{OnAbandonedGrant: func(_ quota.GrantRequest, res quota.GrantResult, err error) {
		if err != nil {
			t.Errorf("abandoned call: %v", err)
		}
		record(res)
	}})
	// Warm up: connections open, statements prepared.
	_, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "warm-up", Amount: 1})
	require.NoError(t, err)
	concurrently(callers, func(i int) {
		// Arrivals spread over 20ms, so that they fall into several
		// statements. A quarter never give up; the others within 0 to
		// 30ms, around the time a statement takes here.
		time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
		ctx, cancel := context.WithCancel(b.ctx)
		if i%4 != 0 {
			ctx, cancel = context.WithTimeout(b.ctx, time.Duration(rand.IntN(30_000))*time.Microsecond)
		}
		defer cancel()
		res, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: int64(1 + i%3)})
		switch {
		case err == nil:
			record(res)
		case errors.Is(err, quota.ErrGrantAbandoned):
			mu.Lock()
			abandoned++
			mu.Unlock()
		case errors.Is(err, context.DeadlineExceeded):
			mu.Lock()
			cancelledUnsent++
			mu.Unlock()
		default:
			t.Errorf("unexpected error: %v", err)
		}
	})
	waitFor(t, "every outcome", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results)+cancelledUnsent == callers
	})
	sum, _ := b.usageRows(t, "q", "m")
	require.LessOrEqual(t, sum, int64(250))
	checkChain(t, results, sum)
	t.Logf("%d answered, %d abandoned after send, %d cancelled before send; counter %d", len(results)-abandoned, abandoned, cancelledUnsent, sum)
}
