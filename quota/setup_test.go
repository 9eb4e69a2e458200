package quota_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
	"github.com/pgquota/pgquota/quota/voucher"
)

// testBundle is this package's view of a testbundle.Bundle: one test's
// database and clients (see testbundle for each field).
type testBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	client   *quota.Client
	operator *quota.Client
	owner    *pgxpool.Pool
}

// setup is testbundle.Setup.
func setup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	tb := testbundle.Setup(t, maxConns)
	return &testBundle{ctx: tb.Ctx, pool: tb.Pool, client: tb.Client, operator: tb.Operator, owner: tb.Owner}
}

// The harness's role clients and config (testbundle documents them).
const (
	roleConns      = testbundle.RoleConns
	envCrashRounds = testbundle.EnvCrashRounds
)

var (
	operatorOf = testbundle.OperatorOf
	relayOf    = testbundle.RelayOf
	relayWith  = testbundle.RelayWith
	testConfig = testbundle.Config

	// leaseOf and fenceOf return the lease and fence client on a quota
	// client (packages lease and fence), one per quota client, for the
	// tests here that still need leases or fenced writes.
	leaseOf = testbundle.LeaseOf
	fenceOf = testbundle.FenceOf

	// The crash tests' helpers (testbundle/crash.go).
	crashRounds              = testbundle.CrashRounds
	newCrashCluster          = testbundle.NewCrashCluster
	crashLoadPool            = testbundle.CrashLoadPool
	crashClient              = testbundle.CrashClient
	requireSynchronousCommit = testbundle.RequireSynchronousCommit
	newCrashLoad             = testbundle.NewCrashLoad

	failoverPrimary = testbundle.FailoverPrimary
	failoverClient  = testbundle.FailoverClient

	newReplyDropper = testbundle.NewReplyDropper
	newTagDropper   = testbundle.NewTagDropper

	concurrently  = testbundle.Concurrently
	waitFor       = testbundle.WaitFor
	lookPgbench   = testbundle.LookPgbench
	runClients    = testbundle.RunClients
	readCommitted = testbundle.ReadCommitted

	exampleDatabase = testbundle.ExampleDatabase
	exampleClient   = testbundle.ExampleClient
)

// errList collects errors from goroutines (testbundle.ErrList).
type errList = testbundle.ErrList

func ptr[T any](v T) *T { return &v }

// voucherOf returns the voucher client of c: one per quota client, made
// with the default Config on first use (or by voucherWith), so that the
// state a voucher client keeps (shard counts, gates) lives as long as c,
// as it did when it was c's own.
//
// t may be nil where no test is at hand (a table of calls): a failure then
// panics.
func voucherOf(t testing.TB, c *quota.Client) *voucher.Client {
	if t != nil {
		t.Helper()
	}
	if v, ok := vouchers.Load(c); ok {
		return v.(*voucher.Client)
	}
	return voucherWith(t, c, nil)
}

// voucherWith makes c's voucher client with cfg (voucherOf returns it from
// then on).
func voucherWith(t testing.TB, c *quota.Client, cfg *voucher.Config) *voucher.Client {
	v, err := voucher.New(c, cfg)
	switch {
	case err != nil && t == nil:
		panic("voucher.New: " + err.Error())
	case err != nil:
		t.Helper()
		t.Fatalf("voucher.New: %v", err)
	}
	vouchers.Store(c, v)
	return v
}

// vouchers maps each quota client to its voucher client (voucherOf).
var vouchers sync.Map

// outboxOf returns the outbox client on c.
func outboxOf(t testing.TB, c *quota.Client) *outbox.Client {
	t.Helper()
	o, err := outbox.New(c)
	if err != nil {
		t.Fatalf("outbox.New: %v", err)
	}
	return o
}

// bundle is b as a testbundle.Bundle (tests also build a testBundle by
// hand, on databases of their own).
func (b *testBundle) bundle() *testbundle.Bundle {
	return &testbundle.Bundle{Ctx: b.ctx, Pool: b.pool, Client: b.client, Operator: b.operator, Owner: b.owner}
}

func (b *testBundle) define(t *testing.T, d quota.Definition) quota.Quota {
	t.Helper()
	return b.bundle().Define(t, d)
}

func (b *testBundle) usageRows(t *testing.T, quotaName, member string) (sum, rows int64) {
	t.Helper()
	return b.bundle().UsageRows(t, quotaName, member)
}

func (b *testBundle) countRows(t *testing.T, table string) int64 {
	t.Helper()
	return b.bundle().CountRows(t, table)
}

func (b *testBundle) setClock(t *testing.T, at string) { t.Helper(); b.bundle().SetClock(t, at) }

func waitForLockWaits(t *testing.T, b *testBundle, n int) {
	t.Helper()
	b.bundle().WaitForLockWaits(t, n)
}

// acquire acquires a lease (package lease) or fails the test.
func (b *testBundle) acquire(t *testing.T, name, holder string, ttl time.Duration) lease.Lease {
	t.Helper()
	l, err := leaseOf(t, b.client).Acquire(b.ctx, lease.AcquireRequest{Name: name, Holder: holder, TTL: ttl})
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	return l
}
