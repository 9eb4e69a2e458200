package fence_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// A holder that crashes frees its slot when its TTL runs out, and not
// before: a psql process takes the only slot of a semaphore of 1
// (pgquota.slot_acquire) and is killed (SIGKILL), releasing nothing. Right
// after, AcquireSlot is refused, naming 1 holder and a retry time within
// the TTL; AcquireSlotWait then gets slot 0 with a larger token, no sooner
// than the crashed holder's expiry by the database clock, and the crashed
// holder's token is refused by the fence from then on.
func TestSlotCrashedHolderFreedAfterTTL(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const ttl = 2 * time.Second
	w := startPsql(t, libpqURL(t, b.pool.Config().ConnString()))
	w.send(t, fmt.Sprintf("SELECT token || ' ' || (extract(epoch FROM expires_at) * 1e6)::bigint FROM pgquota.slot_acquire('crashy', 1, 'psql', 'psql-attempt', '%d milliseconds') WHERE taken;\n", ttl.Milliseconds()))
	var line string
	select {
	case line = <-w.lines:
	case <-time.After(10 * time.Second):
		t.Fatalf("psql printed no slot; stderr: %s", w.stderr)
	}
	f := strings.Fields(line)
	require.Len(t, f, 2, line)
	crashed, _ := strconv.ParseInt(f[0], 10, 64)
	us, _ := strconv.ParseInt(f[1], 10, 64)
	expires := time.UnixMicro(us)
	require.NoError(t, w.cmd.Process.Kill())
	_ = w.cmd.Wait()

	req := lease.SlotRequest{Semaphore: "crashy", Limit: 1, Holder: "next", TTL: time.Minute}
	_, err := b.leases.AcquireSlot(b.ctx, req)
	var full *lease.SemaphoreFullError
	require.ErrorAs(t, err, &full, "the crashed holder's slot is held until its TTL runs out")
	require.Equal(t, 1, full.Holders)
	require.Positive(t, full.RetryAfter)
	require.LessOrEqual(t, full.RetryAfter, ttl)

	s, err := b.leases.AcquireSlotWait(b.ctx, req, nil)
	require.NoError(t, err)
	require.Equal(t, 0, s.Index)
	require.Greater(t, s.Token, crashed)
	require.False(t, s.AcquiredAt.Before(expires), "taken at %s, the crashed holder's slot expired at %s", s.AcquiredAt, expires)

	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: s.Name, Key: "k", Value: "late", Token: crashed, Lease: s.Name})
	require.ErrorIs(t, err, fence.ErrStaleToken, "the crashed holder's token")
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: s.Name, Key: "k", Value: "late", Token: crashed})
	require.ErrorIs(t, err, fence.ErrStaleToken, "the crashed holder's token, without the lease check: the take-over raised the fence")
	_, err = b.fences.WriteRow(b.ctx, fence.WriteRowRequest{Resource: s.Name, Key: "k", Value: "mine", Token: s.Token, Lease: s.Name})
	require.NoError(t, err)
}
