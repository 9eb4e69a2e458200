package quota_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/voucher"
)

// Every error pgquota returns carries exactly one "pgquota: " prefix, at its
// start, where sentinels wrapped by an operation doubled it ("pgquota:
// grant: pgquota: schema is missing ...", "pgquota: grant batch: pgquota:
// permission denied", "read schema version: pgquota: read schema
// version:"). The error paths walked: bad input, unknown quota (Grant,
// GrantTx, Usage, Quota, Revoke, member limits, a batch outcome, a keyed and
// a coalesced grant), no limit, a reused key, an unknown grant, campaign and
// lease, a refused change of kind, a missing schema, a schema newer than
// the build, and a role without privileges; each keeps its sentinel.
func TestErrorsCarryOnePrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(name string, err error, sentinel error) {
		t.Helper()
		require.Error(t, err, name)
		msg := err.Error()
		require.True(t, strings.HasPrefix(msg, "pgquota: "), "%s: %q", name, msg)
		require.Equal(t, 1, strings.Count(msg, "pgquota: "), "%s: %q", name, msg)
		if sentinel != nil {
			require.ErrorIs(t, err, sentinel, name)
		}
	}

	b := setup(t, 0)
	c := b.client
	coal, err := quota.New(b.pool, testConfig(t, &quota.Config{Grouping: quota.GroupByCounter}))
	require.NoError(t, err)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	b.define(t, quota.Definition{Name: "nolimit", Window: quota.WindowDay})

	_, err = c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "", Amount: 1})
	check("bad member", err, quota.ErrInvalidInput)
	_, err = b.operator.DefineQuota(ctx, quota.Definition{Name: "x", Window: "fortnight"})
	check("bad window", err, quota.ErrInvalidInput)
	_, err = c.Grant(ctx, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1})
	check("grant unknown", err, quota.ErrQuotaNotFound)
	_, err = c.Grant(ctx, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k0"}})
	check("keyed grant unknown", err, quota.ErrQuotaNotFound)
	_, err = coal.Grant(ctx, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1})
	check("coalesced grant unknown", err, quota.ErrQuotaNotFound)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = c.GrantTx(ctx, tx, quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1})
	check("grant tx unknown", err, quota.ErrQuotaNotFound)
	_, err = c.GrantTx(ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.NoError(t, err, "the caller's transaction is still usable after ErrQuotaNotFound")
	require.NoError(t, tx.Rollback(ctx))
	_, err = c.Usage(ctx, "nope", "m")
	check("usage unknown", err, quota.ErrQuotaNotFound)
	_, err = c.Quota(ctx, "nope")
	check("quota unknown", err, quota.ErrQuotaNotFound)
	_, err = c.Revoke(ctx, quota.RevokeRequest{Quota: "nope", Member: "m", Amount: 1})
	check("revoke unknown", err, quota.ErrQuotaNotFound)
	_, err = b.operator.SetMemberLimit(ctx, "nope", "m", 1)
	check("member limit unknown", err, quota.ErrQuotaNotFound)
	_, err = c.MemberLimits(ctx, "nope")
	check("member limits unknown", err, quota.ErrQuotaNotFound)
	outs, err := c.GrantBatch(ctx, []quota.GrantRequest{{Quota: "nope", Member: "m", Amount: 1}, {Quota: "nolimit", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k1"}}})
	require.NoError(t, err)
	check("batch unknown", outs[0].Err, quota.ErrQuotaNotFound)
	check("batch no limit", outs[1].Err, quota.ErrNoLimit)
	_, err = c.Grant(ctx, quota.GrantRequest{Quota: "nolimit", Member: "m", Amount: 1})
	check("no limit", err, quota.ErrNoLimit)
	_, err = c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k2"}})
	require.NoError(t, err)
	_, err = c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2, Idempotency: quota.IdempotencyKey{Key: "k2"}})
	check("key reused", err, quota.ErrIdempotencyKeyReused)
	_, err = c.CompensateGrant(ctx, 1<<40)
	check("grant not found", err, quota.ErrGrantNotFound)
	_, err = voucherOf(t, c).Campaign(ctx, "nope")
	check("campaign not found", err, voucher.ErrCampaignNotFound)
	_, err = leaseOf(t, c).Get(ctx, "nope")
	check("lease not found", err, lease.ErrNotFound)
	_, err = b.operator.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowRate, DefaultLimit: ptr(int64(5)), Period: time.Second})
	check("kind change", err, quota.ErrQuotaKindChange)

	// A missing schema.
	empty, err := quota.New(pgtest.Connect(t, pgtest.NewEmptyURL(t), 2), nil)
	require.NoError(t, err)
	_, err = empty.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	check("grant, no schema", err, quota.ErrSchemaMissing)
	_, err = empty.GrantBatch(ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k"}}})
	check("keyed batch, no schema", err, quota.ErrSchemaMissing)
	_, err = empty.Usage(ctx, "q", "m")
	check("usage, no schema", err, quota.ErrSchemaMissing)
	check("check schema, no schema", empty.CheckSchema(ctx), quota.ErrSchemaMissing)

	// A schema newer than this build.
	newerURL := pgtest.NewURL(t)
	_, err = pgtest.ConnectOwner(t, newerURL, 1).Exec(ctx, `INSERT INTO `+migrations.VersionTable+` (version_id, is_applied) VALUES ($1, true)`, migrations.Latest()+1)
	require.NoError(t, err)
	newer, err := quota.New(pgtest.ConnectOwner(t, newerURL, 1), nil)
	require.NoError(t, err)
	check("check schema, newer", newer.CheckSchema(ctx), quota.ErrSchemaNewer)
	check("migrate, newer", newer.Migrate(ctx), quota.ErrSchemaNewer)

	// A role without privileges on pgquota's tables or functions (since
	// migration 00022 the API's functions are SECURITY DEFINER: the
	// table privileges alone no longer decide).
	deniedURL := pgtest.NewURL(t)
	owner := pgtest.ConnectOwner(t, deniedURL, 1)
	ownerClient, err := quota.New(owner, nil)
	require.NoError(t, err)
	_, err = ownerClient.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr(int64(5))})
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `REVOKE ALL ON ALL TABLES IN SCHEMA pgquota FROM `+migrations.AppRole)
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota FROM `+migrations.AppRole)
	require.NoError(t, err)
	app, err := quota.New(pgtest.Connect(t, pgtest.AppURL(t, deniedURL), 2), nil)
	require.NoError(t, err)
	_, err = app.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	check("grant, denied", err, quota.ErrPermissionDenied)
	_, err = app.GrantBatch(ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1}})
	check("batch, denied", err, quota.ErrPermissionDenied)
	_, err = app.GrantBatch(ctx, []quota.GrantRequest{{Quota: "q", Member: "m", Amount: 1, Idempotency: quota.IdempotencyKey{Key: "k"}}})
	check("keyed batch, denied", err, quota.ErrPermissionDenied)
	_, err = app.DefineQuota(ctx, quota.Definition{Name: "r", Window: quota.WindowDay})
	check("define, denied", err, quota.ErrPermissionDenied)
	check("check schema, denied", app.CheckSchema(ctx), quota.ErrPermissionDenied)
}
