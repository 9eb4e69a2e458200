package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// slotReplicas returns n Clients, each on its own pool of maxConns, on one
// fresh database (through PgBouncer under PGQUOTA_TEST_POOLER, as the
// application role under PGQUOTA_TEST_APP_ROLE=1), and the first pool.
func slotReplicas(t *testing.T, n int, maxConns int32) (*pgxpool.Pool, []*quota.Client) {
	t.Helper()
	url := pgtest.PoolURL(t, pgtest.NewURL(t))
	var first *pgxpool.Pool
	clients := make([]*quota.Client, n)
	for i := range clients {
		pool := pgtest.Connect(t, url, maxConns)
		if i == 0 {
			first = pool
		}
		c, err := quota.New(pool, testConfig(t, nil))
		require.NoError(t, err)
		clients[i] = c
	}
	return first, clients
}

// interval is a slot's tenure by the database clock: [from, to).
type interval struct {
	from, to time.Time
	who      string
}

// maxOverlap returns the most intervals that contain one instant, for
// half-open intervals (one ending at t and one starting at t do not
// overlap).
func maxOverlap(ivs []interval) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, iv := range ivs {
		edges = append(edges, edge{iv.from, +1}, edge{iv.to, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta // ends before starts
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// pausedSlotHolder is a psql process holding a slot it took with
// pgquota.slot_acquire, then stopped with SIGSTOP.
type pausedSlotHolder struct {
	w        *pausedWriter
	slot     int
	token    int64
	from, to time.Time
}

// A semaphore of 5 with 200 concurrent acquirers on two Clients (two
// replicas, each its own pool) never has a sixth holder, also when the
// first five holders are real processes paused past their TTL:
//
//   - five psql processes take the five slots (pgquota.slot_acquire, TTL
//     500ms) and are stopped (SIGSTOP), each with a fenced write of its
//     slot queued on its input;
//   - 200 goroutines, half on each Client, AcquireSlotWait, write to their
//     slot's resource with WriteFencedRow (checked against the slot's lease),
//     hold 10-40ms and release;
//   - a watcher samples the held slots in the lease table, by the database
//     clock, in one statement at a time: never more than 5, and 5 seen;
//   - the tenures recorded ([acquired_at, release) by the database clock,
//     [acquired_at, expires_at) for the paused ones, which never release)
//     never overlap more than 5 deep, and do 5 deep;
//   - an in-process count of holders (up after acquire returned, down
//     before release) never passes 5;
//   - every acquirer got a slot below 5, every token is distinct and above
//     every paused holder's;
//   - continued (SIGCONT), each paused holder's fenced write is refused:
//     PQ001 when its slot was taken over with a larger token (its fenced
//     row then holds the last successor's value), PQ002 when nobody took
//     it (it expired: no row).
func TestSlotLimitNeverExceededWithPausedHolders(t *testing.T) {
	t.Parallel()
	pool, clients := slotReplicas(t, 2, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const (
		sem       = "workers"
		limit     = 5
		acquirers = 200
		pausedTTL = 3 * time.Second
	)
	psqlURL := libpqURL(t, pool.Config().ConnString())

	// Every psql connects first, then each takes a slot, so that all five
	// take theirs within the TTL, however slow psql is to start.
	writers := make([]*pausedWriter, limit)
	for i := range writers {
		writers[i] = startPsql(t, psqlURL)
	}
	var paused []pausedSlotHolder
	taken := map[int]bool{}
	for i, w := range writers {
		w.send(t, fmt.Sprintf(`SELECT slot || ' ' || token || ' ' || (extract(epoch FROM acquired_at) * 1e6)::bigint || ' ' || (extract(epoch FROM expires_at) * 1e6)::bigint
FROM pgquota.slot_acquire('%s', %d, 'psql-%d', 'psql-attempt-%d', '%d milliseconds') WHERE taken;
`, sem, limit, i, i, pausedTTL.Milliseconds()))
		var line string
		select {
		case line = <-w.lines:
		case <-time.After(10 * time.Second):
			t.Fatalf("psql %d printed no slot; stderr: %s", i, w.stderr)
		}
		f := strings.Fields(line)
		require.Len(t, f, 4, "psql %d: %q; stderr: %s", i, line, w.stderr)
		h := pausedSlotHolder{w: w}
		h.slot, _ = strconv.Atoi(f[0])
		h.token, _ = strconv.ParseInt(f[1], 10, 64)
		from, _ := strconv.ParseInt(f[2], 10, 64)
		to, _ := strconv.ParseInt(f[3], 10, 64)
		h.from, h.to = time.UnixMicro(from), time.UnixMicro(to)
		taken[h.slot] = true
		w.signal(t, syscall.SIGSTOP)
		leaseName := lease.SlotName(sem, h.slot)
		// What WriteFencedRow sends (queries/fenced_row.sql: the function of
		// migrations/00022), checked against the slot's lease.
		w.send(t, fmt.Sprintf(`SELECT * FROM pgquota.fenced_row_write('%[1]s', 'out', 'stale psql-%[2]d', %[3]d, '%[1]s');
`, leaseName, i, h.token))
		paused = append(paused, h)
	}
	require.Len(t, taken, limit, "the five psql holders hold the five slots (did the machine take more than %s for five statements?)", pausedTTL)
	var maxPausedToken int64
	for _, h := range paused {
		maxPausedToken = max(maxPausedToken, h.token)
	}

	// The watcher.
	var watched, watchedMax atomic.Int64
	stop := make(chan struct{})
	watcherDone := make(chan error, 1)
	go func() {
		defer close(watcherDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var n int64
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pgquota.lease
				WHERE starts_with(name, 'slot:' || $1::text || ':') AND expires_at > clock_timestamp()`, sem).Scan(&n)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "40001" {
				continue // under SERIALIZABLE (CI's pass) a sample may fail: take the next
			}
			if err != nil {
				watcherDone <- err
				return
			}
			watched.Add(1)
			for {
				m := watchedMax.Load()
				if n <= m || watchedMax.CompareAndSwap(m, n) {
					break
				}
			}
		}
	}()

	var (
		mu        sync.Mutex
		tenures   []interval
		tokens    = map[int64]string{}
		local     atomic.Int64
		localMax  atomic.Int64
		wg        sync.WaitGroup
		errs      = make(chan error, acquirers)
		lastValue sync.Map // slot resource -> value written last by a holder
	)
	for i := range acquirers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%len(clients)]
			who := fmt.Sprintf("go-%d", i)
			s, err := leaseOf(t, c).AcquireSlotWait(ctx, lease.SlotRequest{Semaphore: sem, Limit: limit, Holder: who, TTL: 30 * time.Second}, nil)
			if err != nil {
				errs <- fmt.Errorf("%s: acquire: %w", who, err)
				return
			}
			n := local.Add(1)
			for {
				m := localMax.Load()
				if n <= m || localMax.CompareAndSwap(m, n) {
					break
				}
			}
			_, werr := fenceOf(t, c).WriteRow(ctx, fence.WriteRowRequest{Resource: s.Name, Key: "out", Value: who, Token: s.Token, Lease: s.Name})
			lastValue.Store(s.Name, who)
			time.Sleep(time.Duration(10_000+rand.IntN(30_000)) * time.Microsecond)
			local.Add(-1)
			rel, err := leaseOf(t, c).ReleaseSlot(ctx, s)
			if err != nil {
				errs <- fmt.Errorf("%s: release: %w", who, err)
				return
			}
			mu.Lock()
			tenures = append(tenures, interval{s.AcquiredAt, rel.ExpiresAt, who})
			if prev, dup := tokens[s.Token]; dup {
				errs <- fmt.Errorf("%s and %s got token %d", prev, who, s.Token)
			}
			tokens[s.Token] = who
			mu.Unlock()
			switch {
			case werr != nil:
				errs <- fmt.Errorf("%s: fenced write while holding slot %d: %w", who, s.Index, werr)
			case s.Index < 0 || s.Index >= limit:
				errs <- fmt.Errorf("%s: slot %d", who, s.Index)
			case s.Token <= maxPausedToken:
				errs <- fmt.Errorf("%s: token %d not above the paused holders' %d", who, s.Token, maxPausedToken)
			}
		}()
	}
	wg.Wait()
	close(stop)
	require.NoError(t, <-watcherDone)
	close(errs)

	for _, h := range paused {
		tenures = append(tenures, interval{h.from, h.to, fmt.Sprintf("psql-%d", h.slot)})
	}
	require.Equal(t, limit, maxOverlap(tenures), "the tenures by the database clock overlap at most (and at least once exactly) %d deep", limit)
	require.LessOrEqual(t, localMax.Load(), int64(limit), "holders at once, counted in the process")
	require.Equal(t, int64(limit), watchedMax.Load(), "the watcher saw at most %d held, and %d (%d samples)", limit, limit, watched.Load())
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, tokens, acquirers, "every acquirer held a slot once, with its own token")

	retaken := 0
	for _, h := range paused {
		h.w.signal(t, syscall.SIGCONT)
		code := h.w.finish(t)
		require.Equal(t, 3, code, "psql-%d's stale write: psql's exit status; stderr: %s", h.slot, h.w.stderr)
		leaseName := lease.SlotName(sem, h.slot)
		l, err := leaseOf(t, clients[0]).Get(ctx, leaseName)
		require.NoError(t, err)
		if l.Token == h.token {
			// Never taken over (the holders used lower slots): expired.
			require.Contains(t, h.w.stderr.String(), "ERROR:  "+fence.SQLStateLeaseNotHeld+":", "psql-%d's write after its slot expired", h.slot)
			_, err := fenceOf(t, clients[0]).Row(ctx, leaseName, "out")
			require.ErrorIs(t, err, fence.ErrRowNotFound, "slot %d", h.slot)
			continue
		}
		retaken++
		require.Contains(t, h.w.stderr.String(), "ERROR:  "+fence.SQLStateStaleToken+":", "psql-%d's stale write is refused as stale", h.slot)
		row, err := fenceOf(t, clients[0]).Row(ctx, leaseName, "out")
		require.NoError(t, err)
		want, _ := lastValue.Load(leaseName)
		require.Equal(t, want, row.Value, "slot %d holds its last holder's write", h.slot)
		require.Greater(t, row.Token, h.token, "slot %d", h.slot)
	}
	require.Positive(t, retaken, "the paused holders' slots were taken over")
	st, err := leaseOf(t, clients[1]).Semaphore(ctx, sem)
	require.NoError(t, err)
	require.Zero(t, st.Held, "all released")
	require.Equal(t, int64(acquirers+limit), st.Acquisitions)
	t.Logf("%d acquirers on %d clients, %d paused holders: at most %d held (watcher: %d samples), %d tenures overlap at most %d deep; %d stale writes refused (%d slots taken over)",
		acquirers, len(clients), len(paused), watchedMax.Load(), watched.Load(), len(tenures), maxOverlap(tenures), len(paused), retaken)
}
