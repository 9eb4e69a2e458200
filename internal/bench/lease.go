package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// The fenced lock's two hot statements (issue 3, item 9): an acquire of a
// free lease, and a fenced write by the current holder. Each is one
// statement and one round trip.

const (
	// acquireHolder is the holder name of lease-acquire's leases.
	acquireHolder = "pgquota bench"
	// acquireTTL is lease-acquire's TTL: long enough that no lease expires
	// during a run (each name is acquired once anyway).
	acquireTTL = time.Minute

	// FencedHolders is how many held leases fenced-write spreads over.
	FencedHolders = 10000
	// fencedBase numbers fenced-write's leases: lease i (fencedBase < i <=
	// fencedBase+FencedHolders) is named by i's decimal text and held with
	// token i, so one drawn number gives both the resource and the token
	// (the pgbench script draws it the same way). The token sequence is
	// moved past them.
	fencedBase = 1_000_000_000
	// fencedHolder is the holder name of fenced-write's leases.
	fencedHolder = "pgquota bench holder"
	// fencedKey is the one row each fenced-write resource has.
	fencedKey = "state"
)

// leaseAcquire is pgquota's Acquire on a free lease: a new name every call,
// so every call takes the insert path and gets a new token.
type leaseAcquire struct{}

func (leaseAcquire) Name() string { return "lease-acquire" }
func (leaseAcquire) Describe() string {
	return "pgquota Acquire, one statement, a free lease (a new name) every call"
}
func (leaseAcquire) Setup(ctx context.Context, env Env) (Op, error) {
	// The token sequence is kept: tokens only grow.
	if _, err := env.Pool.Exec(ctx, `TRUNCATE pgquota.lease`); err != nil {
		return Op{}, fmt.Errorf("reset leases: %w", err)
	}
	return Op{
		Vars: []Var{{Name: "lease", Min: 1, Max: uniqueMax}},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			// The attempt id is the name, so that every argument that
			// changes from call to call is the drawn number.
			name := strconv.FormatInt(vals[0], 10)
			_, err := env.Leases.Acquire(ctx, lease.AcquireRequest{
				Name: name, Holder: acquireHolder, TTL: acquireTTL, Attempt: name,
			})
			if errors.Is(err, lease.ErrHeld) {
				return Outcome{}, nil // a name drawn twice: not granted, no error
			}
			return Outcome{Granted: err == nil}, err
		},
	}, nil
}

// fencedWrite is pgquota's fence.Client.WriteRow by the current holder of one of
// FencedHolders held leases, each the lease of its own resource: the lease
// row is checked and locked FOR SHARE, the resource's highest token is
// raised (equal tokens are admitted), and the resource's row is updated.
type fencedWrite struct{}

func (fencedWrite) Name() string { return "fenced-write" }
func (fencedWrite) Describe() string {
	return fmt.Sprintf("pgquota fence WriteRow by the lease holder, one statement, spread over %d held leases", FencedHolders)
}
func (fencedWrite) Setup(ctx context.Context, env Env) (Op, error) {
	// The leases are written directly, with the tokens the script can
	// compute; the sequence then moves past them, so that no acquisition
	// ever gets one of these tokens.
	lo, hi := int64(fencedBase+1), int64(fencedBase+FencedHolders)
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{`TRUNCATE pgquota.lease, pgquota.fence, pgquota.fenced_row`, nil},
		{`INSERT INTO pgquota.lease (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
		  SELECT i::text, $3, 'bench-' || i, i, pgquota.clock(), pgquota.clock(), pgquota.clock() + interval '1 day'
		  FROM generate_series($1::bigint, $2::bigint) i`, []any{lo, hi, fencedHolder}},
		{`INSERT INTO pgquota.fence (resource, max_token, updated_at)
		  SELECT i::text, i, pgquota.clock() FROM generate_series($1::bigint, $2::bigint) i`, []any{lo, hi}},
		{`INSERT INTO pgquota.fenced_row (resource, key, value, fence_token, updated_at)
		  SELECT i::text, $3, '', i, pgquota.clock() FROM generate_series($1::bigint, $2::bigint) i`, []any{lo, hi, fencedKey}},
		{`SELECT setval('pgquota.lease_token', greatest($1::bigint, (SELECT last_value FROM pgquota.lease_token)))`, []any{hi}},
		{`ANALYZE pgquota.lease, pgquota.fence, pgquota.fenced_row`, nil},
	} {
		if _, err := env.Pool.Exec(ctx, st.sql, st.args...); err != nil {
			return Op{}, fmt.Errorf("seed held leases: %w", err)
		}
	}
	return Op{
		Vars: []Var{
			{Name: "holder", Min: fencedBase + 1, Max: fencedBase + FencedHolders},
			{Name: "value", Min: 1, Max: 1 << 31},
		},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			name := strconv.FormatInt(vals[0], 10)
			_, err := env.Fences.WriteRow(ctx, fence.WriteRowRequest{
				Resource: name, Key: fencedKey, Value: strconv.FormatInt(vals[1], 10),
				Token: vals[0], Lease: name,
			})
			return Outcome{Granted: err == nil}, err
		},
	}, nil
}
