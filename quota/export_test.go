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

// SetShardGateMaxWait makes c's claims on sharded pools wait up to d for
// a place at the gate before they go ahead without one.
func SetShardGateMaxWait(c *Client, d time.Duration) {
	c.testShardGateMaxWait = d
}

// GrantFenced is the comparison path Client.grantFenced (read, decide,
// fenced write under a lease: four round trips), for the tests that pit it
// against Grant.
func GrantFenced(ctx context.Context, c *Client, req GrantRequest, ttl time.Duration) (GrantResult, error) {
	return c.grantFenced(ctx, req, ttl)
}

// FencedGrantLease is the name of the lease grantFenced takes.
func FencedGrantLease(quota, member string) string { return fencedGrantLease(quota, member) }
