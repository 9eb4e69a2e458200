package fence

import (
	"github.com/pgquota/pgquota/internal/clientcore"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// Client writes and reads fenced rows, guards application tables and runs
// fenced transactions. It is safe for concurrent use by many goroutines.
type Client struct {
	core *core.Core
}

// New returns a fence client on c's pool, with c's settings (retries,
// metrics). It does not touch the database.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) when c is nil.
func New(c *quota.Client) (*Client, error) {
	k, err := clientcore.Of(c)
	if err != nil {
		return nil, err
	}
	return &Client{core: k}, nil
}
