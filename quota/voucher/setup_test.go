package voucher_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// testBundle is one test's database and clients (testbundle.Bundle).
type testBundle struct {
	*testbundle.Bundle
	ctx      context.Context
	pool     *pgxpool.Pool
	client   *quota.Client
	operator *quota.Client
	owner    *pgxpool.Pool
}

func setup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	tb := testbundle.Setup(t, maxConns)
	return &testBundle{Bundle: tb, ctx: tb.Ctx, pool: tb.Pool, client: tb.Client, operator: tb.Operator, owner: tb.Owner}
}

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

var (
	operatorOf    = testbundle.OperatorOf
	testConfig    = testbundle.Config
	concurrently  = testbundle.Concurrently
	lookPgbench   = testbundle.LookPgbench
	runClients    = testbundle.RunClients
	readCommitted = testbundle.ReadCommitted
)
