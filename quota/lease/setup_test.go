package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// testBundle is this package's view of a testbundle.Bundle: one test's
// database and clients (see testbundle for each field), with the lease and
// fence clients on the application's quota client.
type testBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	client   *quota.Client
	operator *quota.Client
	owner    *pgxpool.Pool
	leases   *lease.Client
	fences   *fence.Client
}

// setup is testbundle.Setup.
func setup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	tb := testbundle.Setup(t, maxConns)
	return &testBundle{ctx: tb.Ctx, pool: tb.Pool, client: tb.Client, operator: tb.Operator, owner: tb.Owner,
		leases: leaseOf(t, tb.Client), fences: fenceOf(t, tb.Client)}
}

// The harness's role clients and config (testbundle documents them).
const (
	roleConns      = testbundle.RoleConns
	envCrashRounds = testbundle.EnvCrashRounds
)

var (
	operatorOf = testbundle.OperatorOf
	testConfig = testbundle.Config

	// leaseOf and fenceOf return the lease and fence client on a quota
	// client, one per quota client.
	leaseOf = testbundle.LeaseOf
	fenceOf = testbundle.FenceOf

	// The crash tests' helpers (testbundle/crash.go).
	crashRounds              = testbundle.CrashRounds
	newCrashCluster          = testbundle.NewCrashCluster
	crashLoadPool            = testbundle.CrashLoadPool
	crashClient              = testbundle.CrashClient
	requireSynchronousCommit = testbundle.RequireSynchronousCommit
	isPreSend                = testbundle.IsPreSend
	newCrashLoad             = testbundle.NewCrashLoad

	failoverPrimary = testbundle.FailoverPrimary
	failoverClient  = testbundle.FailoverClient

	concurrently = testbundle.Concurrently
)

func ptr[T any](v T) *T { return &v }

// bundle is b as a testbundle.Bundle (tests also build a testBundle by
// hand, on databases of their own).
func (b *testBundle) bundle() *testbundle.Bundle {
	return &testbundle.Bundle{Ctx: b.ctx, Pool: b.pool, Client: b.client, Operator: b.operator, Owner: b.owner}
}

func (b *testBundle) ownerClient(t *testing.T) *quota.Client {
	t.Helper()
	return b.bundle().OwnerClient(t)
}

func (b *testBundle) appDDL(t *testing.T, ddl string, schemas []string, tables ...string) {
	t.Helper()
	b.bundle().AppDDL(t, ddl, schemas, tables...)
}

func (b *testBundle) countRows(t *testing.T, table string) int64 {
	t.Helper()
	return b.bundle().CountRows(t, table)
}

func (b *testBundle) setClock(t *testing.T, at string) { t.Helper(); b.bundle().SetClock(t, at) }

func (b *testBundle) waitForLockWait(t *testing.T) { t.Helper(); b.bundle().WaitForLockWait(t) }

// pgCode is the SQLSTATE of the PostgreSQL error in err's chain, or "".
var pgCode = core.SQLState

// roleBundle is a migrated database with a client per pgquota role
// (testbundle.Roles).
type roleBundle struct {
	ctx               context.Context
	app, relay, owner *pgxpool.Pool
	appC, relayC, opC *quota.Client
	operatorPool      *pgxpool.Pool
}

func roleSetup(t *testing.T) *roleBundle {
	t.Helper()
	r := testbundle.RoleSetup(t)
	return &roleBundle{ctx: r.Ctx, app: r.App, relay: r.Relay, owner: r.Owner, appC: r.AppC, relayC: r.RelayC, opC: r.OpC, operatorPool: r.OperatorPool}
}

// acquire acquires a lease or fails the test.
func (b *testBundle) acquire(t *testing.T, name, holder string, ttl time.Duration) lease.Lease {
	t.Helper()
	l, err := b.leases.Acquire(b.ctx, lease.AcquireRequest{Name: name, Holder: holder, TTL: ttl})
	require.NoError(t, err)
	return l
}
