package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// issueSpins acquires and releases lease spin n times and returns the
// last token.
func issueSpins(ctx context.Context, t *testing.T, c *quota.Client, n int) int64 {
	t.Helper()
	var last int64
	for range n {
		l, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: "spin", Holder: "S", TTL: time.Hour})
		require.NoError(t, err)
		last = l.Token
		_, err = leaseOf(t, c).Release(ctx, l)
		require.NoError(t, err)
	}
	return last
}

// TestLeaseEpochBumpRaisesOnlyWhatEveryStandbyHas proves, on a real
// primary and a real asynchronous standby streaming through a physical
// replication slot, that BumpLeaseEpoch raises the epoch only once every
// standby the primary knows has flushed it, refuses (raising nothing) while
// the standby is cut off, and that a standby promoted after receiving a
// prepared bump, but not its raise, issues tokens above every token the
// old primary issued in the raised epoch; the deposed holder's writes with
// its token are then refused.
func TestLeaseEpochBumpRaisesOnlyWhatEveryStandbyHas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const leaseName = "public.reports"
	primary, op := failoverPrimary(t)
	old := failoverClient(t, primary)
	a0, err := leaseOf(t, old).Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "A0", TTL: time.Hour})
	require.NoError(t, err)
	_, err = leaseOf(t, old).Release(ctx, lease.Lease{Name: leaseName, Token: a0.Token})
	require.NoError(t, err)
	e1 := a0.Token >> lease.TokenEpochShift

	standby := primary.NewStandbyWithSlot("standby", "standby1")

	// Fewer standbys than required: refused, nothing raised.
	_, err = leaseOf(t, op).BumpEpoch(ctx, lease.BumpEpochRequest{Standbys: 2, Timeout: time.Second})
	require.ErrorIs(t, err, lease.ErrEpochUnconfirmed)
	require.ErrorContains(t, err, "1 of the 2 standbys required confirmed")
	e, err := leaseOf(t, op).Epoch(ctx)
	require.NoError(t, err)
	require.Equal(t, e1, e.Epoch, "a refused bump raises nothing")

	// Streaming: confirmed and raised.
	e, err = leaseOf(t, op).BumpEpoch(ctx, lease.BumpEpochRequest{Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, e1+1, e.Epoch)
	require.Len(t, e.Standbys, 1)
	assert.True(t, e.Standbys[0].Confirmed, "%+v", e.Standbys[0])
	assert.Equal(t, "streaming", e.Standbys[0].State)

	// A bump prepared, flushed by the standby, and raised after the
	// standby was cut off: the standby has the pending epoch, not the raise.
	var pending, raised int64
	primary.QueryValue("app", "SELECT pgquota.lease_epoch_prepare(0)", &pending)
	require.Equal(t, e1+2, pending)
	primary.WaitReplayed(standby)
	standby.CutOff()
	primary.QueryValue("app", "SELECT pgquota.lease_epoch_raise($1)", &raised, pending)
	require.Equal(t, pending, raised)

	// Cut off: the slot is inactive and behind, the bump refuses.
	_, err = leaseOf(t, op).BumpEpoch(ctx, lease.BumpEpochRequest{Timeout: 2 * time.Second})
	require.ErrorIs(t, err, lease.ErrEpochUnconfirmed)
	var ue *lease.EpochUnconfirmedError
	require.True(t, errors.As(err, &ue), "%v", err)
	require.Len(t, ue.Standbys, 1)
	assert.Equal(t, "slot standby1", ue.Standbys[0].Name)
	assert.Equal(t, "disconnected", ue.Standbys[0].State)
	assert.False(t, ue.Standbys[0].Confirmed)
	assert.ErrorContains(t, err, "slot standby1 (disconnected")
	t.Logf("refused: %v", err)
	e, err = leaseOf(t, op).Epoch(ctx)
	require.NoError(t, err)
	require.Equal(t, e1+2, e.Epoch, "the refused bump left the epoch")
	require.Equal(t, e1+3, e.Pending, "and recorded the pending epoch, which the standby never received")

	// What the standby misses: tokens in epoch e1+2, A's lease and writes.
	highest := issueSpins(ctx, t, old, 100)
	a, err := leaseOf(t, old).Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, e1+2, a.Token>>lease.TokenEpochShift)
	highest = max(highest, a.Token)
	_, err = fenceOf(t, old).WriteRow(ctx, fence.WriteRowRequest{Resource: "ext", Key: "k", Value: "A", Token: a.Token})
	require.NoError(t, err)
	require.NoError(t, guardedWrite(ctx, old.Pool(), 1, "A", a.Token, leaseName))
	old.Pool().Close()
	op.Pool().Close()

	primary.Crash()
	standby.Promote()

	cur := failoverClient(t, standby)
	b, err := leaseOf(t, cur).Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "B", TTL: time.Hour})
	require.NoError(t, err)
	t.Logf("old primary: epoch %d, last token %d (A %d); promoted standby: B acquires %d (epoch %d)",
		e1+2, highest, a.Token, b.Token, b.Token>>lease.TokenEpochShift)
	assert.Equal(t, e1+3, b.Token>>lease.TokenEpochShift, "above the pending epoch the standby received")
	assert.Greater(t, b.Token, highest, "the first token after the promotion exceeds every token the old primary issued")

	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: "ext", Key: "k", Value: "B", Token: b.Token})
	require.NoError(t, err)
	require.NoError(t, guardedWrite(ctx, cur.Pool(), 1, "B", b.Token, leaseName))
	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: "ext", Key: "k", Value: "A stale", Token: a.Token})
	assert.ErrorIs(t, err, fence.ErrStaleToken, "A's external-style write")
	assertGuardRejects(ctx, t, cur.Pool(), 1, a.Token)
}

// TestLeaseEpochBumpUnconfirmedLetsAPromotedStandbyIssueLowerTokens pins
// the risk BumpLeaseEpochRequest.Unconfirmed documents, on real clusters:
// the standby (no replication slot) is cut off, so the primary sees no
// standby and a plain bump refuses; with Unconfirmed the standby misses
// the bump (and everything after), the
// old primary issues tokens in the bumped epoch E; the promoted standby
// issues tokens in its timeline + its own offset, which is E again, with a
// lower sequence number: its first token is below the old primary's last,
// and a deposed holder's external-style write with its old token lands
// until a write with a higher token raises the mark.
func TestLeaseEpochBumpUnconfirmedLetsAPromotedStandbyIssueLowerTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, op := failoverPrimary(t)
	old := failoverClient(t, primary)
	issueSpins(ctx, t, old, 1)
	standby := primary.NewStandby("standby")
	standby.CutOff()

	before, err := leaseOf(t, op).Epoch(ctx)
	require.NoError(t, err)
	// The standby has no slot: the primary sees no standby, and a plain
	// bump refuses rather than guess there is none.
	_, err = leaseOf(t, op).BumpEpoch(ctx, lease.BumpEpochRequest{Timeout: time.Second})
	require.ErrorIs(t, err, lease.ErrEpochUnconfirmed)
	require.ErrorContains(t, err, "the primary sees no standby")
	e, err := leaseOf(t, op).Epoch(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Epoch, e.Epoch, "nothing raised")

	e, err = leaseOf(t, op).BumpEpoch(ctx, lease.BumpEpochRequest{Unconfirmed: true, Standbys: 1, Timeout: time.Second})
	require.NoError(t, err, "Unconfirmed raises although no standby confirmed")
	require.Equal(t, before.Epoch+1, e.Epoch)
	last := issueSpins(ctx, t, old, 50)
	a, err := leaseOf(t, old).Acquire(ctx, lease.AcquireRequest{Name: "report", Holder: "A", TTL: time.Hour})
	require.NoError(t, err)
	last = max(last, a.Token)
	require.Equal(t, e.Epoch, a.Token>>lease.TokenEpochShift)
	old.Pool().Close()
	op.Pool().Close()

	primary.Crash()
	standby.Promote()
	cur := failoverClient(t, standby)
	b, err := leaseOf(t, cur).Acquire(ctx, lease.AcquireRequest{Name: "report", Holder: "B", TTL: time.Hour})
	require.NoError(t, err)
	t.Logf("unconfirmed bump to epoch %d: old primary's last token %d; promoted standby's first %d", e.Epoch, last, b.Token)
	require.Equal(t, e.Epoch, b.Token>>lease.TokenEpochShift, "the promoted standby lands in the bumped epoch: timeline + its old offset")
	require.Less(t, b.Token, last, "its tokens are below the old primary's")
	_, err = fenceOf(t, cur).WriteRow(ctx, fence.WriteRowRequest{Resource: "orders", Key: "o", Value: "A stale", Token: a.Token})
	require.NoError(t, err, "the deposed holder's external-style write lands")
}

// TestBaseBackupStartedAsItsOwnClusterNeedsAMinEpochAboveTheSource proves
// what docs/failover.md tells an operator who starts a base backup (or a
// file-system snapshot) as a cluster of its own while the source goes on:
// the copy keeps the source's system identifier and timeline, so it issues
// tokens in the epoch of the backup, below the source's once the source
// bumped; a plain bump on the copy reaches only the source's epoch again
// (below the source's tokens); `bump --min-epoch` one above the epoch the
// source shows puts every token of the copy above every token of the
// source.
func TestBaseBackupStartedAsItsOwnClusterNeedsAMinEpochAboveTheSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	source := pgcluster.New(t, "source", nil)
	source.CreateDatabase("app")
	src, err := quota.New(pgcluster.Pool(t, source.URL("app")), nil)
	require.NoError(t, err)
	backedUp := issueSpins(ctx, t, src, 3)

	cp := source.NewCopy("copy")
	// The source goes on: it bumps its epoch and issues more tokens.
	se, err := leaseOf(t, src).BumpEpoch(ctx, lease.BumpEpochRequest{NoStandbys: true, Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, backedUp>>lease.TokenEpochShift+1, se.Epoch)
	srcLast := issueSpins(ctx, t, src, 100)
	srcEpoch, err := leaseOf(t, src).Epoch(ctx) // what the operator reads on the source
	require.NoError(t, err)

	dst, err := quota.New(pgcluster.Pool(t, cp.URL("app")), nil)
	require.NoError(t, err)
	var srcSys, dstSys int64
	source.QueryValue("app", "SELECT pgquota.system_identifier()", &srcSys)
	cp.QueryValue("app", "SELECT pgquota.system_identifier()", &dstSys)
	require.Equal(t, srcSys, dstSys, "a base backup keeps the system identifier")
	t1 := issueSpins(ctx, t, dst, 1)
	require.Equal(t, backedUp>>lease.TokenEpochShift, t1>>lease.TokenEpochShift, "the copy issues in the backup's epoch")
	require.Less(t, t1, srcLast)

	e, err := leaseOf(t, dst).BumpEpoch(ctx, lease.BumpEpochRequest{NoStandbys: true, Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, srcEpoch.Epoch, e.Epoch, "a plain bump on the copy reaches the source's epoch, no more")
	t2 := issueSpins(ctx, t, dst, 1)
	require.Less(t, t2, srcLast, "and its tokens are still below the source's")

	e, err = leaseOf(t, dst).BumpEpoch(ctx, lease.BumpEpochRequest{MinEpoch: srcEpoch.Epoch + 1, NoStandbys: true, Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, srcEpoch.Epoch+1, e.Epoch)
	t3 := issueSpins(ctx, t, dst, 1)
	t.Logf("source: epoch %d, last token %d; copy: %d, after a plain bump %d, after --min-epoch %d: %d",
		srcEpoch.Epoch, srcLast, t1, t2, srcEpoch.Epoch+1, t3)
	require.Greater(t, t3, srcLast)
	require.Greater(t, t3, srcEpoch.Ceiling, "above the source's ceiling too")
}
