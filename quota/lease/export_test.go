package lease

import "context"

// Test hooks, compiled into the package's tests only.

// SetBeforeRenew makes a Keeper started with o call hook before each
// renewal; an error it returns replaces the renewal's outcome.
func SetBeforeRenew(o *KeepaliveOptions, hook func(ctx context.Context) error) {
	o.beforeRenew = hook
}
