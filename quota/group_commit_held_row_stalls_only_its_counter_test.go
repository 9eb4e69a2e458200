package quota_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// TestGroupCommitHeldRowStallsOnlyItsCounter holds one counter's row in an
// application transaction (GrantTx, not committed) while a group of the
// default Config decides calls of that counter and of 20 others. The 20
// must be decided while the row is still held (a group waits at most
// groupLockWait, then splits by counter); the held counter's call must
// still be waiting on the row lock (pg_stat_activity shows it), and once
// the application commits it is granted from the committed value. Every
// counter ends exact. Without the split every call of the group waited
// for the application's commit. Both statements of the group path are
// covered: a calendar quota (pgquota.usage_grant_batch) and a rate
// (pgquota.grant_limits_batch); and a counter whose row the application
// created (an insert not committed) as well as one it updated.
func TestGroupCommitHeldRowStallsOnlyItsCounter(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		def      func(name string) quota.Definition
		existing bool // the held counter's row exists before the application's grant
		counted  bool // usage rows count the units (calendar)
		keyed    bool // the calls carry idempotency keys (the keyed lane)
	}{
		{"calendar, row updated", func(n string) quota.Definition { return quota.CalendarWindow(n, quota.WindowNone, "", 1000) }, true, true, false},
		{"calendar, row inserted", func(n string) quota.Definition { return quota.CalendarWindow(n, quota.WindowNone, "", 1000) }, false, true, false},
		{"calendar keyed, row updated", func(n string) quota.Definition { return quota.CalendarWindow(n, quota.WindowNone, "", 1000) }, true, true, true},
		{"rate, state updated", func(n string) quota.Definition { return quota.Rate(n, 1000, time.Hour, 1000) }, true, false, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 12)
			qname := fmt.Sprintf("held%d", i)
			b.define(t, tc.def(qname))
			gate := newGroupGate()
			// The default Config: group commit across counters.
			c, err := quota.New(b.pool, testConfig(t, &quota.Config{}))
			require.NoError(t, err)
			quota.SetGroupSend(c, gate.hook)
			quota.SetGroupInFlight(c, 1)
			require.NoError(t, quota.WarmKinds(b.ctx, c, qname))
			// call makes a call's request (its key, on the keyed lane)
			// in the test's goroutine; the call runs when invoked.
			calls := 0
			call := func(member string) func() (quota.GrantResult, error) {
				req := quota.GrantRequest{Quota: qname, Member: member, Amount: 1}
				if tc.keyed {
					calls++
					req.Idempotency = quota.IdempotencyKey{Key: fmt.Sprintf("%s-%d", member, calls)}
				}
				return func() (quota.GrantResult, error) { return c.Grant(b.ctx, req) }
			}
			if tc.existing {
				_, err := call("held")()
				require.NoError(t, err)
			}

			// The application's transaction takes the held counter's row.
			// At READ COMMITTED, as the application's transactions run: under a
			// server default of SERIALIZABLE its COMMIT could fail with 40001
			// beside the calls decided meanwhile, which it would retry.
			tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			appRes, err := c.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: qname, Member: "held", Amount: 1})
			require.NoError(t, err)
			require.True(t, appRes.Granted)

			// A lone call takes the client's one place in flight and is held
			// in the hook, so that the next calls queue into one group.
			gate.arm()
			type outcome struct {
				res quota.GrantResult
				err error
			}
			first := make(chan outcome, 1)
			firstCall := call("first")
			go func() { r, err := firstCall(); first <- outcome{r, err} }()
			gate.wait(t)
			held := make(chan outcome, 1)
			heldCall := call("held")
			go func() { r, err := heldCall(); held <- outcome{r, err} }()
			const others = 20
			done := make(chan outcome, others)
			for n := range others {
				f := call(fmt.Sprintf("m%02d", n))
				go func() { r, err := f(); done <- outcome{r, err} }()
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				unkeyed, keyed := quota.GroupQueued(c)
				queued := unkeyed
				if tc.keyed {
					queued = keyed
				}
				if queued == others+1 {
					break
				}
				require.True(t, time.Now().Before(deadline), "the calls did not queue (%d of %d)", queued, others+1)
				time.Sleep(5 * time.Millisecond)
			}
			gate.open()
			require.NoError(t, (<-first).err)

			// The other counters are decided while the row is still held.
			for range others {
				select {
				case o := <-done:
					require.NoError(t, o.err)
					require.True(t, o.res.Granted)
				case <-time.After(60 * time.Second):
					t.Fatal("calls of other counters stalled behind the row the application holds")
				}
			}
			select {
			case o := <-held:
				t.Fatalf("the held counter's call returned before the application committed: %+v, %v", o.res, o.err)
			default:
			}
			// It waits on the row lock, in the database.
			deadline = time.Now().Add(30 * time.Second)
			for {
				var waiting int
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
				if waiting == 1 {
					break
				}
				require.True(t, time.Now().Before(deadline), "no backend waits on the held row (%d)", waiting)
				time.Sleep(10 * time.Millisecond)
			}

			require.NoError(t, tx.Commit(b.ctx))
			var o outcome
			select {
			case o = <-held:
			case <-time.After(60 * time.Second):
				t.Fatal("the held counter's call did not return after the commit")
			}
			require.NoError(t, o.err)
			require.True(t, o.res.Granted)
			want := int64(2)
			if tc.existing {
				want = 3
			}
			if tc.counted {
				require.Equal(t, want, o.res.Used, "decided from the committed value")
				used, _ := b.usageRows(t, qname, "held")
				require.Equal(t, want, used)
				for n := range others {
					used, _ := b.usageRows(t, qname, fmt.Sprintf("m%02d", n))
					require.Equal(t, int64(1), used)
				}
			} else {
				require.Equal(t, 1000-want, o.res.Remaining, "decided from the committed state")
			}
		})
	}
}
