package quota

import (
	"context"
	"time"
)

// Test hooks, compiled into the package's tests only.

// SetFencedGrantPause makes GrantFenced on c call pause between its read
// and its fenced write.
func SetFencedGrantPause(c *Client, pause func(ctx context.Context, l Lease)) {
	c.testHookFencedGrantPause = pause
}

// SetFencedGrantRelease makes GrantFenced on c call hook just before it
// releases its lease.
func SetFencedGrantRelease(c *Client, hook func(ctx context.Context, l Lease)) {
	c.testHookFencedGrantRelease = hook
}

// SetBeforeRenew makes a Keeper started with o call hook before each
// renewal; an error it returns replaces the renewal's outcome.
func SetBeforeRenew(o *KeepaliveOptions, hook func(ctx context.Context) error) {
	o.beforeRenew = hook
}

// SetCoalesceSend makes c call hook before each coalesced statement with
// the number of calls it decides. Set it before the first Grant.
func SetCoalesceSend(c *Client, hook func(n int)) {
	c.testHookCoalesceSend = hook
}

// CoalesceQueued returns the number of coalesced calls of c waiting, not
// sent yet, for quota and member.
func CoalesceQueued(c *Client, quota, member string) int {
	return c.coalescer.queued(quota, member)
}

// SetGroupSend makes c call hook before each statement of the group-commit
// path (a lone call's included) with the requests it decides. Set it
// before the first Grant.
func SetGroupSend(c *Client, hook func(reqs []GrantRequest)) {
	c.testHookGroupSend = hook
}

// GroupQueued returns the number of grouped calls of c waiting, not sent
// yet, unkeyed and keyed.
func GroupQueued(c *Client) (unkeyed, keyed int) {
	c.grouper.mu.Lock()
	defer c.grouper.mu.Unlock()
	return len(c.grouper.lanes[0].waiting), len(c.grouper.lanes[1].waiting)
}

// SetGroupInFlight sets how many statements per lane c's group commit
// keeps in flight. Set it before the first Grant.
func SetGroupInFlight(c *Client, n int) {
	c.grouper.inFlight = n
}

// GrantFenced is the comparison path Client.grantFenced (read, decide,
// fenced write under a lease: four round trips), for the tests that pit it
// against Grant.
func GrantFenced(ctx context.Context, c *Client, req GrantRequest, ttl time.Duration) (GrantResult, error) {
	return c.grantFenced(ctx, req, ttl)
}

// FencedGrantLease is the name of the lease grantFenced takes.
func FencedGrantLease(quota, member string) string { return fencedGrantLease(quota, member) }

// WarmKinds makes c read and remember the kind of each named quota now, so
// that a test's next statement through c is the grant itself (a Client
// reads a quota's kind before its first grant on it).
func WarmKinds(ctx context.Context, c *Client, names ...string) error {
	for _, n := range names {
		if _, err := c.quotaKind(ctx, c.db.Reads(), n); err != nil {
			return err
		}
	}
	return nil
}
