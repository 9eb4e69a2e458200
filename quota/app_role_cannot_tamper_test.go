package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
	"github.com/pgquota/pgquota/quota/voucher"
)

// roleBundle is a migrated database with a client per pgquota role
// (testbundle.Roles).
type roleBundle struct {
	ctx               context.Context
	app, relay, owner *pgxpool.Pool
	appC, relayC, opC *quota.Client
	operatorPool      *pgxpool.Pool
}

// roleSetup is testbundle.RoleSetup, in this file's field names.
func roleSetup(t *testing.T) *roleBundle {
	t.Helper()
	r := testbundle.RoleSetup(t)
	return &roleBundle{ctx: r.Ctx, app: r.App, relay: r.Relay, owner: r.Owner, appC: r.AppC, relayC: r.RelayC, opC: r.OpC, operatorPool: r.OperatorPool}
}

// requireDenied runs sql on pool and expects 42501 (insufficient_privilege).
func requireDenied(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.Error(t, err, "%s must be refused", sql)
	require.Equal(t, "42501", pgCode(err), "%s: %v", sql, err)
}

// Every tamper a LOGIN member of pgquota_app could run with plain SQL
// before the lockdown (issue: the least-privilege role is not least) is
// refused with 42501, and leaves the state as it was: the counters, the
// limits, the lease and its fence, the guard, the ledger, the outbox and
// the lease epoch.
func TestAppRoleCannotTamper(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	_, err := b.opC.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		g, err := b.appC.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
		require.NoError(t, err)
		require.True(t, g.Granted)
	}
	keyed, err := b.appC.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "k", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "key1"}})
	require.NoError(t, err)
	l, err := leaseOf(t, b.appC).Acquire(ctx, lease.AcquireRequest{Name: "res", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	_, err = b.owner.Exec(ctx, `CREATE TABLE public.guarded (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	_, err = b.owner.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON public.guarded TO pgquota_app`)
	require.NoError(t, err)
	ownerC, err := quota.New(b.owner, nil)
	require.NoError(t, err)
	_, err = fenceOf(t, ownerC).GuardTable(ctx, fence.GuardTableRequest{Table: "public.guarded", Column: "tok"})
	require.NoError(t, err)
	eventID, err := outboxOf(t, b.appC).Enqueue(ctx, "topic", []byte("x"), nil)
	require.NoError(t, err)
	var epoch int64
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT epoch FROM pgquota.lease_epoch`).Scan(&epoch))

	tampers := []struct {
		name, sql string
		args      []any
	}{
		{"reset a counter", `UPDATE pgquota.usage SET used = 0`, nil},
		{"delete a counter", `DELETE FROM pgquota.usage`, nil},
		{"truncate the counters", `TRUNCATE pgquota.usage`, nil},
		{"raise a default limit", `UPDATE pgquota.quota SET default_limit = 1000 WHERE name = 'q'`, nil},
		{"raise a default limit through the operator's function", `SELECT * FROM pgquota.quota_define('q', 'day', 1000, 'UTC', false)`, nil},
		{"add an override", `INSERT INTO pgquota.quota_override (quota_name, member, limit_value) VALUES ('q', 'm', 1000)`, nil},
		{"add an override through the operator's function", `SELECT * FROM pgquota.quota_override_set('q', 1000, 'm')`, nil},
		{"forge a lease row", `INSERT INTO pgquota.lease (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
			VALUES ('forged', 'x', 'x', 9000000000000000, now(), now(), now() + interval '1 hour')`, nil},
		{"steal a lease row", `UPDATE pgquota.lease SET holder = 'thief', token = token + 1 WHERE name = 'res'`, nil},
		{"move a fence mark up", `UPDATE pgquota.fence SET max_token = 9223372036854775807 WHERE resource = 'res'`, nil},
		{"move a fence mark down", `UPDATE pgquota.fence SET max_token = 1 WHERE resource = 'res'`, nil},
		{"flip a guarded resource to external", `UPDATE pgquota.fence_guard_resource SET external = true`, nil},
		{"flip a guarded resource to external through the operator's function", `SELECT pgquota.fence_guard_register('public.guarded', true, NULL, NULL)`, nil},
		{"set a ledger outcome", `UPDATE pgquota.ledger_outcome SET granted = false, used = 0 WHERE grant_id = $1`, []any{keyed.GrantID}},
		{"delete a ledger row", `DELETE FROM pgquota.ledger`, nil},
		{"mark an outbox event delivered", `UPDATE pgquota.outbox SET state = 'delivered' WHERE id = $1`, []any{eventID}},
		{"mark an outbox event delivered through the relay's function", `SELECT pgquota.outbox_mark_delivered(ARRAY[$1::bigint])`, []any{eventID}},
		{"bump the lease epoch", `SELECT pgquota.lease_epoch_bump(8388607)`, nil},
		{"rewrite the lease epoch", `UPDATE pgquota.lease_epoch SET epoch = 8388607`, nil},
		{"lower the lease epoch", `UPDATE pgquota.lease_epoch SET epoch = 0`, nil},
		{"call fence_admit", `SELECT pgquota.fence_admit('res', 9223372036854775807, 'res')`, nil},
		{"call grant_counter", `SELECT * FROM pgquota.grant_counter('q', 'm', -5, 'day', 5, now(), now(), now() + interval '1 day')`, nil},
		{"take a token from the sequence", `SELECT nextval('pgquota.lease_token')`, nil},
		{"set the token sequence", `SELECT setval('pgquota.lease_token', 1)`, nil},
		{"reap leases", `SELECT * FROM pgquota.lease_reap(0, 100, true)`, nil},
		{"import codes", `SELECT * FROM pgquota.voucher_import_codes('c', ARRAY['a'])`, nil},
		{"grant the roles", `SELECT pgquota.grant_roles()`, nil},
	}
	for _, tc := range tampers {
		t.Run(tc.name, func(t *testing.T) {
			requireDenied(t, b.app, tc.sql, tc.args...)
		})
	}

	// Nothing moved.
	u, err := b.appC.Usage(ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(5), u.Used)
	require.Equal(t, int64(5), u.Limit)
	g, err := b.appC.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.False(t, g.Granted, "the limit of 5 still holds")
	got, err := leaseOf(t, b.appC).Get(ctx, "res")
	require.NoError(t, err)
	require.Equal(t, l.Token, got.Token)
	require.Equal(t, "a", got.Holder)
	fs, err := fenceOf(t, b.appC).State(ctx, "res")
	require.NoError(t, err)
	require.Equal(t, l.Token, fs.Highest)
	var external bool
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT external FROM pgquota.fence_guard_resource WHERE resource = 'public.guarded'`).Scan(&external))
	require.False(t, external)
	var state string
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT state FROM pgquota.outbox WHERE id = $1`, eventID).Scan(&state))
	require.Equal(t, "pending", state)
	var epochAfter int64
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT epoch FROM pgquota.lease_epoch`).Scan(&epochAfter))
	require.Equal(t, epoch, epochAfter)
	// A holder still writes the guarded table with its own token.
	gl, err := leaseOf(t, b.appC).Acquire(ctx, lease.AcquireRequest{Name: "public.guarded", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, b.app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgquota.present_token('public.guarded', $1, 'public.guarded')`, gl.Token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO public.guarded (id) VALUES (1)`)
		return err
	}))
}

// The relay role runs the relay (claim, deliver, reap) and nothing of the
// API or the operator's: it may not grant, define or enqueue.
func TestRelayRoleRunsTheRelayOnly(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	for i := 0; i < 3; i++ {
		_, err := outboxOf(t, b.appC).Enqueue(ctx, "t", []byte(fmt.Sprint(i)), nil)
		require.NoError(t, err)
	}
	delivered := 0
	relay, err := outboxOf(t, b.relayC).NewRelay(func(context.Context, outbox.Event) error { delivered++; return nil }, outbox.RelayConfig{Topics: []string{"t"}})
	require.NoError(t, err)
	res, err := relay.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Delivered)
	require.Equal(t, 3, delivered)
	_, err = outboxOf(t, b.relayC).Reap(ctx, time.Hour)
	require.NoError(t, err)

	_, err = outboxOf(t, b.relayC).Enqueue(ctx, "t", []byte("x"), nil)
	require.ErrorIs(t, err, quota.ErrPermissionDenied)
	_, err = b.relayC.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	require.ErrorIs(t, err, quota.ErrPermissionDenied)
	requireDenied(t, b.relay, `UPDATE pgquota.outbox SET state = 'pending'`)
}

// The operator role defines quotas and campaigns, sets limits, imports
// codes, bumps the lease epoch, registers a guard and reaps; the app role
// gets ErrPermissionDenied for each, with a message naming the operator
// role and the command that grants it.
func TestOperatorRoleDefinesAndAppRoleIsToldWhichRole(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	calls := []struct {
		name string
		call func(c *quota.Client) error
	}{
		{"define a quota", func(c *quota.Client) error {
			_, err := c.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
			return err
		}},
		{"set a member limit", func(c *quota.Client) error { _, err := c.SetMemberLimit(ctx, "q", "m", 7); return err }},
		{"clear a member limit", func(c *quota.Client) error { _, err := c.ClearMemberLimit(ctx, "q", "m"); return err }},
		{"create a campaign", func(c *quota.Client) error { _, err := voucherOf(t, c).CreateCampaign(ctx, "pool", 3); return err }},
		{"create a sharded campaign", func(c *quota.Client) error {
			_, err := voucherOf(t, c).CreateShardedCampaign(ctx, "sharded", 4, 2)
			return err
		}},
		{"import codes", func(c *quota.Client) error {
			_, err := voucherOf(t, c).ImportCodes(ctx, "codes", []string{"a", "b"})
			return err
		}},
		{"bump the lease epoch", func(c *quota.Client) error {
			_, err := leaseOf(t, c).BumpEpoch(ctx, lease.BumpEpochRequest{NoStandbys: true, Timeout: time.Minute})
			return err
		}},
		{"reap leases", func(c *quota.Client) error {
			_, err := leaseOf(t, c).Reap(ctx, lease.ReapRequest{OlderThan: time.Hour})
			return err
		}},
		{"reap the ledger", func(c *quota.Client) error { _, err := c.ReapLedger(ctx, time.Hour); return err }},
	}
	for _, tc := range calls {
		err := tc.call(b.appC)
		require.ErrorIs(t, err, quota.ErrPermissionDenied, tc.name)
		require.Equal(t, "42501", pgCode(err), tc.name)
		require.Contains(t, err.Error(), "pgquota_operator", tc.name)
		require.Contains(t, err.Error(), "pgquota migrate grant-operator --role", tc.name)
		require.NoError(t, tc.call(b.opC), tc.name)
	}
	// The operator's definitions are the app's to use.
	g, err := b.appC.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 5})
	require.NoError(t, err)
	require.True(t, g.Granted)
	c, err := voucherOf(t, b.appC).Claim(ctx, voucher.ClaimRequest{Campaign: "codes", Member: "m"})
	require.NoError(t, err)
	require.True(t, c.Claimed)
}
