package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgquota/pgquota/internal/core"
)

// ErrGuardNotFiring is returned by CheckGuards when the guard of a table
// will not fire for some writes (see GuardStatus.Problem).
var ErrGuardNotFiring = errors.New("pgquota: fence guard does not fire")

// GuardStatus is a guarded table and whether its guard fires.
type GuardStatus struct {
	// Table is the guarded table, schema-qualified and quoted as SQL.
	Table string `json:"table"`
	// Resource is its fence resource ("" when its binding row is gone).
	Resource string `json:"resource"`
	// Fires is true when both triggers exist and fire for ordinary
	// sessions, and no role or database is set to
	// session_replication_role = replica while they fire only in origin
	// sessions (the default).
	Fires bool `json:"fires"`
	// Problem says why the guard does not fire, when it does not: a
	// trigger disabled (ALTER TABLE ... DISABLE TRIGGER), set to fire only
	// in replica sessions (ENABLE REPLICA TRIGGER) or missing, or a role or
	// database whose sessions run as replica and bypass it.
	Problem string `json:"problem,omitempty"`
}

// GuardedTables lists every table guarded by GuardTable, ordered by name,
// with whether its guard fires (pgquota.fence_guards(), in
// migrations/00018_guard_binding.sql). A session that sets
// session_replication_role = replica itself (a superuser, a role granted
// SET on that parameter, a logical replication apply worker) bypasses a
// guard whose triggers fire in origin sessions only, the default; ENABLE
// ALWAYS TRIGGER makes them fire there too.
//
// Errors: quota.ErrSchemaMissing; database errors.
func (c *Client) GuardedTables(ctx context.Context) ([]GuardStatus, error) {
	out, err := core.Retry(ctx, c.core.Policy, func() ([]GuardStatus, error) {
		rows, err := c.core.Pool.Query(ctx, `SELECT table_name, coalesce(resource, ''), fires, coalesce(problem, '') FROM pgquota.fence_guards()`)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (GuardStatus, error) {
			var g GuardStatus
			err := r.Scan(&g.Table, &g.Resource, &g.Fires, &g.Problem)
			return g, err
		})
	})
	if err != nil {
		return nil, core.DBError("list guarded tables", err)
	}
	return out, nil
}

// CheckGuards returns nil when the guard of every guarded table fires
// (GuardedTables), else an error wrapping ErrGuardNotFiring that names
// each table and its problem. `pgquota ... --metrics-addr` serves it on
// /healthz.
//
// Errors: ErrGuardNotFiring; quota.ErrSchemaMissing; database errors.
func (c *Client) CheckGuards(ctx context.Context) error {
	gs, err := c.GuardedTables(ctx)
	if err != nil {
		return err
	}
	var bad []string
	for _, g := range gs {
		if !g.Fires {
			bad = append(bad, g.Table+": "+g.Problem)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrGuardNotFiring, strings.Join(bad, "; "))
	}
	return nil
}
