package quota_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// grouping returns a client with group commit (Config.Grouping) on b's pool, with at
// most inFlight statements per lane (0 for the default), whose hook sees
// every statement of the group path.
func (b *testBundle) grouping(t *testing.T, cfg quota.Config, inFlight int, hook func([]quota.GrantRequest)) *quota.Client {
	t.Helper()
	cfg.Grouping = quota.GroupAcrossCounters
	c, err := quota.New(b.pool, testConfig(t, &cfg))
	require.NoError(t, err)
	if hook != nil {
		quota.SetGroupSend(c, hook)
	}
	if inFlight > 0 {
		quota.SetGroupInFlight(c, inFlight)
	}
	return c
}

// groupGate holds the statements of a group path: after arm, the next
// statement (a lone call or a group) waits in the hook until open, and
// wait reports the requests it carries.
type groupGate struct {
	mu    sync.Mutex
	armed bool
	cur   chan struct{} // closed by open: the held statement goes on
	held  chan []quota.GrantRequest
}

func newGroupGate() *groupGate {
	return &groupGate{held: make(chan []quota.GrantRequest, 1)}
}

func (g *groupGate) hook(reqs []quota.GrantRequest) {
	g.mu.Lock()
	if !g.armed {
		g.mu.Unlock()
		return
	}
	g.armed = false
	release := make(chan struct{})
	g.cur = release
	g.mu.Unlock()
	g.held <- reqs
	<-release
}

// arm makes the next statement wait.
func (g *groupGate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = true
}

// wait returns the requests of the statement held now.
func (g *groupGate) wait(t *testing.T) []quota.GrantRequest {
	t.Helper()
	select {
	case r := <-g.held:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no statement reached the group hook")
		return nil
	}
}

// open lets the statement held last go on.
func (g *groupGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.cur)
}

// TestGrantGroupCommitExactAcross512Callers runs 512 concurrent callers,
// one grant each, through two Clients (replicas) with group commit, over 48
// counters of two quotas whose limits come from the call, a member's
// override or the quota's default. Each counter's granted calls must be
// exactly min(limit, asks), its row must equal the units reported granted,
// and the outcomes of one counter must form one chain of counter values
// (each call's Used is what it would have got alone, in some order). The
// group hook must have seen statements deciding calls of different
// counters at once: without group commit every call is its own statement.
func TestGrantGroupCommitExactAcross512Callers(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "day", Window: quota.WindowDay, DefaultLimit: ptr[int64](7)})
	b.define(t, quota.Definition{Name: "life", Window: quota.WindowNone})
	type counter struct {
		quota, member string
		callLimit     *int64
		limit         int64
	}
	var counters []counter
	for i := range 24 {
		m := fmt.Sprintf("m%02d", i)
		c := counter{quota: "day", member: m, limit: 7}
		if i%3 == 0 {
			_, err := b.operator.SetMemberLimit(b.ctx, "day", m, int64(i/3))
			require.NoError(t, err)
			c.limit = int64(i / 3)
		}
		counters = append(counters, c)
		l := int64(i % 17)
		counters = append(counters, counter{quota: "life", member: m, callLimit: &l, limit: l})
	}
	var (
		mu       sync.Mutex
		maxMixed int
		stmts    int
	)
	hook := func(reqs []quota.GrantRequest) {
		distinct := map[string]bool{}
		for _, r := range reqs {
			distinct[r.Quota+"\x00"+r.Member] = true
		}
		mu.Lock()
		defer mu.Unlock()
		stmts++
		maxMixed = max(maxMixed, len(distinct))
	}
	clients := []*quota.Client{b.grouping(t, quota.Config{}, 0, hook), b.grouping(t, quota.Config{}, 0, hook)}

	const callers = 512
	results := make([]quota.GrantResult, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c := counters[i%len(counters)]
			results[i], errs[i] = clients[i%2].Grant(b.ctx, quota.GrantRequest{Quota: c.quota, Member: c.member, Amount: 1, Limit: c.callLimit})
		}()
	}
	close(start)
	wg.Wait()

	byCounter := make(map[int][]quota.GrantResult)
	asks := make(map[int]int64)
	for i := range callers {
		require.NoError(t, errs[i], "call %d", i)
		n := i % len(counters)
		byCounter[n] = append(byCounter[n], results[i])
		asks[n]++
	}
	var totalGranted, totalUsed int64
	for n, c := range counters {
		var granted int64
		for _, r := range byCounter[n] {
			require.Equal(t, c.limit, r.Limit, "counter %s/%s", c.quota, c.member)
			if r.Granted {
				granted++
			}
		}
		require.Equal(t, min(c.limit, asks[n]), granted, "counter %s/%s: granted == min(limit, asks)", c.quota, c.member)
		used, _ := b.usageRows(t, c.quota, c.member)
		require.Equal(t, granted, used, "counter %s/%s: the row holds the units reported granted", c.quota, c.member)
		checkChain(t, byCounter[n], used)
		totalGranted += granted
		totalUsed += used
	}
	require.Equal(t, totalGranted, totalUsed)
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, maxMixed, 1, "a statement decided calls of several counters")
	require.Less(t, stmts, callers, "calls shared statements (%d statements for %d calls)", stmts, callers)
	t.Logf("%d calls in %d statements, up to %d counters in one", callers, stmts, maxMixed)
}

// TestGrantGroupCommitCancelMidBatch cancels one call while it waits in
// the queue and another after its group was sent. The first returns its
// context's error and is never granted; the second returns
// ErrGrantAbandoned wrapping ErrOutcomeUnknown (never a granted or denied
// answer it cannot know), its outcome reaches Config.OnAbandonedGrant, and
// the counter holds exactly the units of the calls decided.
func TestGrantGroupCommitCancelMidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](100)})
	gate := newGroupGate()
	abandoned := make(chan quota.GrantResult, 4)
	c := b.grouping(t, quota.Config{OnAbandonedGrant: func(_ quota.GrantRequest, res quota.GrantResult, err error) {
		require.NoError(t, err)
		abandoned <- res
	}}, 1, gate.hook)

	type call struct {
		res quota.GrantResult
		err error
	}
	grant := func(ctx context.Context, member string, amount int64) chan call {
		ch := make(chan call, 1)
		go func() {
			r, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: member, Amount: amount})
			ch <- call{r, err}
		}()
		return ch
	}
	// A lone call holds the lane's only place.
	gate.arm()
	first := grant(b.ctx, "first", 1)
	require.Len(t, gate.wait(t), 1)

	ctxQueued, cancelQueued := context.WithCancel(b.ctx)
	defer cancelQueued()
	ctxSent, cancelSent := context.WithCancel(b.ctx)
	defer cancelSent()
	queued := grant(ctxQueued, "a", 2)
	waitFor(t, "a queued", func() bool { n, _ := quota.GroupQueued(c); return n == 1 })
	queuedN := func(want int) func() bool {
		return func() bool { n, _ := quota.GroupQueued(c); return n == want }
	}
	other1 := grant(b.ctx, "b", 3)
	waitFor(t, "b queued", queuedN(2))
	sent := grant(ctxSent, "c", 4)
	waitFor(t, "c queued", queuedN(3))
	other2 := grant(b.ctx, "a", 5)
	waitFor(t, "4 queued", queuedN(4))

	// Cancelled while queued: nothing was sent for it.
	cancelQueued()
	q := <-queued
	require.ErrorIs(t, q.err, context.Canceled)
	require.NotErrorIs(t, q.err, quota.ErrOutcomeUnknown)
	require.NotErrorIs(t, q.err, quota.ErrGrantAbandoned)

	// The next statement is the group of the three left.
	gate.arm()
	gate.open()
	f := <-first
	require.NoError(t, f.err)
	require.True(t, f.res.Granted)
	group := gate.wait(t)
	require.Len(t, group, 3)
	require.Equal(t, []string{"b", "c", "a"}, []string{group[0].Member, group[1].Member, group[2].Member})

	// Cancelled after it was sent: its outcome is unknown to its caller.
	cancelSent()
	s := <-sent
	require.ErrorIs(t, s.err, quota.ErrGrantAbandoned)
	require.ErrorIs(t, s.err, quota.ErrOutcomeUnknown)
	require.ErrorIs(t, s.err, context.Canceled)
	require.Zero(t, s.res)

	gate.open()
	o1, o2 := <-other1, <-other2
	require.NoError(t, o1.err)
	require.NoError(t, o2.err)
	require.True(t, o1.res.Granted)
	require.Equal(t, int64(3), o1.res.Used)
	require.True(t, o2.res.Granted)
	require.Equal(t, int64(5), o2.res.Used, "a's cancelled call (2 units) was never granted")
	ab := <-abandoned
	require.True(t, ab.Granted)
	require.Equal(t, "c", ab.Member)
	require.Equal(t, int64(4), ab.Used)

	for member, want := range map[string]int64{"first": 1, "a": 5, "b": 3, "c": 4} {
		used, _ := b.usageRows(t, "q", member)
		require.Equal(t, want, used, member)
	}
}

// TestGrantGroupCommitKeyedSharedBatch sends keyed calls of different
// counters in one group, a key given twice among them, and a key reused
// for another request. Each recorded call gets its own grant id and ledger
// entry; the copy replays the first; a repeat after the group returns the
// first outcome and changes nothing.
func TestGrantGroupCommitKeyedSharedBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
	gate := newGroupGate()
	c := b.grouping(t, quota.Config{}, 1, gate.hook)

	gate.arm()
	type call struct {
		res quota.GrantResult
		err error
	}
	grant := func(req quota.GrantRequest) chan call {
		ch := make(chan call, 1)
		go func() {
			r, err := c.Grant(b.ctx, req)
			ch <- call{r, err}
		}()
		return ch
	}
	first := grant(quota.GrantRequest{Quota: "q", Member: "x", Amount: 1, Idempotency: key("k0")})
	require.Len(t, gate.wait(t), 1)
	reqs := []quota.GrantRequest{
		{Quota: "q", Member: "m1", Amount: 6, Idempotency: key("k1")},
		{Quota: "q", Member: "m2", Amount: 2, Idempotency: key("k2")},
		{Quota: "q", Member: "m1", Amount: 6, Idempotency: key("k1")}, // the same request again
		{Quota: "q", Member: "m1", Amount: 6, Idempotency: key("k3")}, // denied: 12 > 10
		{Quota: "q", Member: "m2", Amount: 1, Idempotency: key("k2")}, // k2 reused for another request
		{Quota: "nope", Member: "m1", Amount: 1, Idempotency: key("k4")},
		{Quota: "q", Member: "m2", Amount: 1}, // unkeyed: the other lane, at once
	}
	chans := make([]chan call, len(reqs))
	for i, r := range reqs {
		chans[i] = grant(r)
		if r.Idempotency.Key != "" {
			want := i + 1
			waitFor(t, "keyed call queued", func() bool { _, n := quota.GroupQueued(c); return n == want })
		}
	}
	unkeyed := <-chans[6]
	require.NoError(t, unkeyed.err, "an unkeyed call does not wait behind the keyed lane")
	require.True(t, unkeyed.res.Granted)

	gate.arm()
	gate.open()
	require.NoError(t, (<-first).err)
	require.Len(t, gate.wait(t), 6, "the six keyed calls share one group")
	gate.open()
	got := make([]call, 6)
	for i := range got {
		got[i] = <-chans[i]
	}
	require.NoError(t, got[0].err)
	require.True(t, got[0].res.Granted)
	require.Equal(t, int64(6), got[0].res.Used)
	require.False(t, got[0].res.Replayed)
	requireStored(t, b, got[0].res)
	require.NoError(t, got[1].err)
	require.True(t, got[1].res.Granted)
	require.Equal(t, int64(3), got[1].res.Used, "m2: the unkeyed unit, then these 2")
	requireStored(t, b, got[1].res)
	require.NoError(t, got[2].err)
	require.True(t, got[2].res.Replayed)
	require.Equal(t, got[0].res.GrantID, got[2].res.GrantID)
	require.Equal(t, got[0].res.Used, got[2].res.Used)
	require.NoError(t, got[3].err)
	require.False(t, got[3].res.Granted)
	require.Equal(t, int64(6), got[3].res.Used)
	requireStored(t, b, got[3].res)
	require.ErrorIs(t, got[4].err, quota.ErrIdempotencyKeyReused)
	require.ErrorIs(t, got[5].err, quota.ErrQuotaNotFound)

	// Repeats after the group: the first outcomes, nothing granted again.
	for _, i := range []int{0, 1, 3} {
		r, err := c.Grant(b.ctx, reqs[i])
		require.NoError(t, err)
		require.True(t, r.Replayed)
		require.Equal(t, got[i].res.GrantID, r.GrantID)
		require.Equal(t, got[i].res.Granted, r.Granted)
		require.Equal(t, got[i].res.Used, r.Used)
	}
	m1, _ := b.usageRows(t, "q", "m1")
	m2, _ := b.usageRows(t, "q", "m2")
	require.Equal(t, int64(6), m1)
	require.Equal(t, int64(3), m2)
}

// TestGrantGroupCommitUnknownQuotaBesideGood puts an undefined quota and
// a quota with no limit in one group beside good calls: those two get
// their own errors, exactly as alone, and the others are decided, calls of
// one counter in arrival order.
func TestGrantGroupCommitUnknownQuotaBesideGood(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](5)})
	b.define(t, quota.Definition{Name: "nolimit", Window: quota.WindowDay})
	gate := newGroupGate()
	c := b.grouping(t, quota.Config{}, 1, gate.hook)
	type call struct {
		res quota.GrantResult
		err error
	}
	grant := func(req quota.GrantRequest) chan call {
		ch := make(chan call, 1)
		go func() {
			r, err := c.Grant(b.ctx, req)
			ch <- call{r, err}
		}()
		return ch
	}
	gate.arm()
	first := grant(quota.GrantRequest{Quota: "q", Member: "x", Amount: 1})
	require.Len(t, gate.wait(t), 1)
	reqs := []quota.GrantRequest{
		{Quota: "q", Member: "m", Amount: 3},
		{Quota: "missing", Member: "m", Amount: 1},
		{Quota: "nolimit", Member: "m", Amount: 1},
		{Quota: "q", Member: "m", Amount: 3}, // denied: 6 > 5
		{Quota: "q", Member: "n", Amount: 5},
		{Quota: "q", Member: "m", Amount: 2},
	}
	chans := make([]chan call, len(reqs))
	for i, r := range reqs {
		chans[i] = grant(r)
		want := i + 1
		waitFor(t, "call queued", func() bool { n, _ := quota.GroupQueued(c); return n == want })
	}
	gate.arm()
	gate.open()
	require.NoError(t, (<-first).err)
	require.Len(t, gate.wait(t), len(reqs))
	gate.open()
	got := make([]call, len(reqs))
	for i := range got {
		got[i] = <-chans[i]
	}
	require.ErrorIs(t, got[1].err, quota.ErrQuotaNotFound)
	require.ErrorIs(t, got[2].err, quota.ErrNoLimit)
	for i, want := range map[int]struct {
		granted bool
		used    int64
	}{0: {true, 3}, 3: {false, 3}, 4: {true, 5}, 5: {true, 5}} {
		require.NoError(t, got[i].err, "call %d", i)
		require.Equal(t, want.granted, got[i].res.Granted, "call %d", i)
		require.Equal(t, want.used, got[i].res.Used, "call %d", i)
		require.Equal(t, int64(5), got[i].res.Limit)
	}
	// The same calls alone give the same errors.
	_, errMissing := b.client.Grant(b.ctx, reqs[1])
	_, errNoLimit := b.client.Grant(b.ctx, reqs[2])
	require.Equal(t, errMissing.Error(), got[1].err.Error())
	require.Equal(t, errNoLimit.Error(), got[2].err.Error())
	m, _ := b.usageRows(t, "q", "m")
	n, _ := b.usageRows(t, "q", "n")
	require.Equal(t, int64(5), m)
	require.Equal(t, int64(5), n)
	require.Zero(t, b.countRows(t, "usage WHERE quota_name = 'nolimit'"))
}

// TestGrantGroupCommitTwoClientsNoDeadlock runs two Clients whose callers
// walk the same 64 existing counters in opposite orders, so that their
// groups hold the same counters in opposite arrival orders. The groups
// lock counters in key order, so the database detects no deadlock (its
// deadlocks count for the test's database stays 0), and the totals are
// exact.
func TestGrantGroupCommitTwoClientsNoDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](quota.MaxUnits)})
	const members = 64
	for i := range members {
		_, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: fmt.Sprint("m", i), Amount: 1})
		require.NoError(t, err)
	}
	deadlocks := func() int64 {
		var n int64
		_, err := b.owner.Exec(b.ctx, `SELECT pg_stat_clear_snapshot()`)
		require.NoError(t, err)
		require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n))
		return n
	}
	before := deadlocks()
	clients := []*quota.Client{b.grouping(t, quota.Config{}, 0, nil), b.grouping(t, quota.Config{}, 0, nil)}
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	const perClient, rounds = 64, 8
	for ci, c := range clients {
		for g := range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					i := (g + r*7) % members
					if ci == 1 {
						i = members - 1 - i
					}
					_, err := c.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: fmt.Sprint("m", i), Amount: 1})
					if err != nil {
						errMu.Lock()
						firstErr = errors.Join(firstErr, err)
						errMu.Unlock()
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	require.NoError(t, firstErr)
	var total int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sum(used) FROM pgquota.usage WHERE quota_name = 'q'`).Scan(&total))
	require.Equal(t, int64(members+2*perClient*rounds), total)
	// Statistics reach pg_stat_database within a second or so of the
	// transactions' end.
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, before, deadlocks(), "deadlocks detected in the test's database")
}
