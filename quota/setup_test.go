package quota_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
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
const roleConns = testbundle.RoleConns

var (
	operatorOf = testbundle.OperatorOf
	relayOf    = testbundle.RelayOf
	relayWith  = testbundle.RelayWith
	testConfig = testbundle.Config

	concurrently = testbundle.Concurrently
	waitFor      = testbundle.WaitFor

	exampleDatabase = testbundle.ExampleDatabase
	exampleClient   = testbundle.ExampleClient
)

func ptr[T any](v T) *T { return &v }

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

func (b *testBundle) ownerClient(t *testing.T) *quota.Client {
	t.Helper()
	return b.bundle().OwnerClient(t)
}

func (b *testBundle) appDDL(t *testing.T, ddl string, schemas []string, tables ...string) {
	t.Helper()
	b.bundle().AppDDL(t, ddl, schemas, tables...)
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
