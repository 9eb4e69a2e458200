package lease

import (
	"github.com/pgquota/pgquota/internal/clientcore"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// Client acquires, renews, releases, lists and reaps leases, and runs the
// helpers built on them (Do, Keepalive, Election, semaphores). It is safe
// for concurrent use by many goroutines. Make one per quota.Client and
// share it: its AcquireWait calls share one LISTEN connection.
type Client struct {
	core *core.Core
	// pooler is the quota.Client's Config.Pooler: with
	// quota.PoolerTransaction, AcquireWait polls instead of LISTENing.
	pooler quota.PoolerMode
	// notifier is AcquireWait's shared LISTEN connection (lease.go).
	notifier notifier
}

// New returns a lease client on c's pool, with c's settings (retries,
// metrics, quota.Config.Pooler). It does not touch the database.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) when c is nil.
func New(c *quota.Client) (*Client, error) {
	k, err := clientcore.Of(c)
	if err != nil {
		return nil, err
	}
	return &Client{core: k, pooler: c.Config().Pooler}, nil
}
