package quota

import (
	"context"
)

// Test hooks, compiled into the package's tests only.

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
