package quota_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/voucher"
)

// serializableSetup returns a client whose connections start every
// transaction SERIALIZABLE, as with
// PGOPTIONS='-c default_transaction_isolation=serializable' or a role or
// database default.
func serializableSetup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	open := func(u string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(u)
		require.NoError(t, err)
		cfg.MaxConns = maxConns
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
		pgtest.Reserve(t, int(maxConns), fmt.Sprintf("a serializable pool of %d", maxConns))
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	// As the application's role under PGQUOTA_TEST_APP_ROLE=1 (SuiteURL),
	// with its operator work as the operator's, on serializable
	// connections too.
	pool := open(pgtest.SuiteURL(t, dbURL))
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	operator := client
	if pgtest.AppRoleMode() {
		operator, err = quota.New(open(pgtest.OperatorURL(t, dbURL)), nil)
		require.NoError(t, err)
	}
	return &testBundle{ctx: t.Context(), pool: pool, client: client, operator: operator, owner: pgtest.ConnectOwner(t, dbURL, 1)}
}

// Serialization failures (40001) and deadlocks are
// retried where pgquota owns the transaction. Calls on the pool run in a
// transaction pgquota owns (one statement, or ImportCodes' own); with
// serializable as the server's default isolation (a role or database
// setting, PGOPTIONS), concurrent calls on one row must not surface 40001.
func TestBreakDefaultSerializable(t *testing.T) {
	t.Parallel()
	b := serializableSetup(t, 16)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)})
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "pool", 100)
	require.NoError(t, err)
	codes := make([]string, 100)
	for i := range codes {
		codes[i] = fmt.Sprintf("code-%03d", i)
	}
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", codes)
	require.NoError(t, err)

	var grants, revokes, claims, codeClaims, acquires, writes, imports errList
	var granted, revoked int64
	var mu sync.Mutex
	concurrently(32, func(i int) {
		for range 5 {
			res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2})
			grants.Add(err)
			r, rerr := b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1})
			revokes.Add(rerr)
			mu.Lock()
			if err == nil && res.Granted {
				granted += res.Amount
			}
			revoked += r.Revoked
			mu.Unlock()
		}
		_, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "pool", Member: fmt.Sprint("member-", i)})
		claims.Add(err)
		_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "codes", Member: fmt.Sprint("member-", i)})
		codeClaims.Add(err)
		_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{fmt.Sprint("new-", i), "shared"})
		imports.Add(err)
		l, err := leaseOf(t, b.client).Acquire(b.ctx, lease.AcquireRequest{Name: "lease", Holder: "h", TTL: time.Millisecond})
		if errors.Is(err, lease.ErrHeld) {
			err = nil
		}
		acquires.Add(err)
		if err == nil && l.Token > 0 {
			_, err = fenceOf(t, b.client).WriteRow(b.ctx, fence.WriteRowRequest{Resource: "res", Key: "k", Value: "v", Token: l.Token})
			if err != nil && errorsIsStale(err) {
				err = nil
			}
			writes.Add(err)
		}
	})
	grants.RequireNone(t, "Grant")
	revokes.RequireNone(t, "Revoke")
	claims.RequireNone(t, "Claim counted")
	codeClaims.RequireNone(t, "Claim codes")
	imports.RequireNone(t, "ImportCodes")
	acquires.RequireNone(t, "Acquire")
	writes.RequireNone(t, "WriteFencedRow")
	sum, _ := b.usageRows(t, "q", "m")
	require.Equal(t, granted-revoked, sum)
}

func errorsIsStale(err error) bool { return errors.Is(err, fence.ErrStaleToken) }
