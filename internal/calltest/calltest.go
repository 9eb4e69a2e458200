// Package calltest makes one of every kind of pgquota call on a client, for
// tests that prove a connection setting or a role can make them all: the
// application role (migrations.AppRole), a session with an empty
// search_path.
package calltest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
	"github.com/pgquota/pgquota/quota/voucher"
)

// Exercise makes every kind of call pgquota's library offers on client
// (quotas, grants keyed and not, batches, revokes and compensation,
// counted, sharded and code vouchers, leases, fenced writes and reads,
// ledger reads and reaping, outbox enqueue, listing, relaying and reaping,
// the schema check) on a migrated database, checking each outcome. Names
// start with prefix so that calls on one database do not collide.
func Exercise(t *testing.T, client *quota.Client, prefix string) {
	t.Helper()
	ExerciseRoles(t, Clients{App: client, Relay: client, Operator: client}, prefix)
}

// Clients are the clients ExerciseRoles makes each call with: App for the
// API, Relay for the outbox relay and its reaping, Operator for defining
// quotas and campaigns, limits, code imports and ledger reaping (the roles
// of migrations.AppRole, RelayRole and OperatorRole).
type Clients struct {
	App, Relay, Operator *quota.Client
}

// ExerciseRoles is Exercise with each call made by the client of the role
// that may make it.
func ExerciseRoles(t *testing.T, cs Clients, prefix string) {
	t.Helper()
	client, op := cs.App, cs.Operator
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, pool, codes, sharded, leaseName := prefix+"q", prefix+"pool", prefix+"codes", prefix+"sharded", prefix+"lease"

	require.NoError(t, client.CheckSchema(ctx))
	_, err := op.DefineQuota(ctx, quota.Definition{Name: q, Window: quota.WindowDay, DefaultLimit: ptr(int64(10))})
	require.NoError(t, err)
	_, err = client.Quota(ctx, q)
	require.NoError(t, err)
	_, err = client.Quotas(ctx)
	require.NoError(t, err)
	_, err = op.SetMemberLimit(ctx, q, "m", 5)
	require.NoError(t, err)
	_, err = client.MemberLimits(ctx, q)
	require.NoError(t, err)
	g, err := client.Grant(ctx, quota.GrantRequest{Quota: q, Member: "m", Amount: 1})
	require.NoError(t, err)
	require.True(t, g.Granted)
	keyed, err := client.Grant(ctx, quota.GrantRequest{Quota: q, Member: "m", Amount: 2, Idempotency: quota.IdempotencyKey{Key: prefix + "k1"}})
	require.NoError(t, err)
	require.True(t, keyed.Granted)
	require.Positive(t, keyed.GrantID)
	out, err := client.GrantBatch(ctx, []quota.GrantRequest{{Quota: q, Member: "b", Amount: 1}, {Quota: q, Member: "b", Amount: 1}})
	require.NoError(t, err)
	require.Len(t, out, 2)
	_, err = client.Revoke(ctx, quota.RevokeRequest{Quota: q, Member: "m", Amount: 1})
	require.NoError(t, err)
	_, err = client.CompensateGrant(ctx, keyed.GrantID)
	require.NoError(t, err)
	u, err := client.Usage(ctx, q, "m")
	require.NoError(t, err)
	require.Zero(t, u.Used)
	_, err = op.ClearMemberLimit(ctx, q, "m")
	require.NoError(t, err)
	_, err = client.LedgerEntry(ctx, keyed.GrantID)
	require.NoError(t, err)
	_, err = client.LedgerEntryByKey(ctx, quota.IdempotencyKey{Key: prefix + "k1", Scope: q})
	require.NoError(t, err)
	_, err = op.ReapLedger(ctx, time.Hour)
	require.NoError(t, err)

	vouchers, opVouchers := voucherOf(t, client), voucherOf(t, op)
	_, err = opVouchers.CreateCampaign(ctx, pool, 2)
	require.NoError(t, err)
	c, err := vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: pool, Member: "m"})
	require.NoError(t, err)
	require.True(t, c.Claimed)
	_, err = vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: pool, Member: "n", Idempotency: quota.IdempotencyKey{Key: prefix + "k2"}})
	require.NoError(t, err)
	_, err = opVouchers.CreateShardedCampaign(ctx, sharded, 4, 2)
	require.NoError(t, err)
	c, err = vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: sharded, Member: "m"})
	require.NoError(t, err)
	require.True(t, c.Claimed)
	_, err = opVouchers.ImportCodes(ctx, codes, []string{"a", "b"})
	require.NoError(t, err)
	c, err = vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: codes, Member: "m"})
	require.NoError(t, err)
	require.True(t, c.Claimed)
	_, err = vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: codes, Member: "n", Idempotency: quota.IdempotencyKey{Key: prefix + "k3"}})
	require.NoError(t, err)
	_, err = vouchers.Campaign(ctx, codes)
	require.NoError(t, err)

	leases, err := lease.New(client)
	require.NoError(t, err)
	fences, err := fence.New(client)
	require.NoError(t, err)
	l, err := leases.Acquire(ctx, lease.AcquireRequest{Name: leaseName, Holder: "h", TTL: time.Minute})
	require.NoError(t, err)
	l, err = leases.Renew(ctx, lease.Lease{Name: leaseName, Token: l.Token}, time.Minute)
	require.NoError(t, err)
	_, err = fences.WriteRow(ctx, fence.WriteRowRequest{Resource: leaseName, Key: "k", Value: "v", Token: l.Token})
	require.NoError(t, err)
	_, err = fences.Row(ctx, leaseName, "k")
	require.NoError(t, err)
	_, err = fences.Rows(ctx, leaseName)
	require.NoError(t, err)
	_, err = fences.State(ctx, leaseName)
	require.NoError(t, err)
	_, err = leases.Get(ctx, leaseName)
	require.NoError(t, err)
	_, err = leases.Release(ctx, lease.Lease{Name: leaseName, Token: l.Token})
	require.NoError(t, err)

	events, err := outbox.New(client)
	require.NoError(t, err)
	relayEvents, err := outbox.New(cs.Relay)
	require.NoError(t, err)
	id, err := events.Enqueue(ctx, prefix+"topic", []byte("x"), nil)
	require.NoError(t, err)
	require.Positive(t, id)
	_, err = events.Events(ctx, outbox.Filter{})
	require.NoError(t, err)
	_, err = events.Status(ctx)
	require.NoError(t, err)
	relay, err := relayEvents.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.RelayConfig{Topics: []string{prefix + "topic"}})
	require.NoError(t, err)
	res, err := relay.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Delivered)
	_, err = relayEvents.Reap(ctx, time.Hour)
	require.NoError(t, err)
}

func ptr[T any](v T) *T { return &v }

// voucherOf returns the voucher client on c.
func voucherOf(t *testing.T, c *quota.Client) *voucher.Client {
	t.Helper()
	v, err := voucher.New(c, nil)
	require.NoError(t, err)
	return v
}
