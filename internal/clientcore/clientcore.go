// Package clientcore builds the core (internal/core) of a capability
// package's client from a quota.Client: its pool and the settings every
// client shares (retries, metrics). quota/outbox and the other capability
// packages use it in their New.
package clientcore

import (
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/quota"
)

// Of returns a Core on c's pool with c's settings.
//
// Errors: an *InputError naming "client" when c is nil, or what core.New
// returns for c's settings.
func Of(c *quota.Client) (*core.Core, error) {
	if c == nil {
		return nil, core.Invalid("client", "must not be nil")
	}
	cfg := c.Config()
	return core.New(c.Pool(), core.Options{RetryMaxElapsed: cfg.RetryMaxElapsed, MeterProvider: cfg.MeterProvider, MetricsQuotaName: cfg.MetricsQuotaName})
}
