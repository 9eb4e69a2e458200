package quota_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/voucher"
)

// A state-changing call whose statement (or COMMIT) reached the server and
// committed, but whose reply was lost, fails with an error that says the
// outcome is unknown (errors.Is ErrOutcomeUnknown), keeps the original
// error in its chain, and the write is really there.
func TestOutcomeUnknownAfterLostReply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// dropTag is the command tag of the reply to lose ("" for the
		// first reply that completes a statement).
		dropTag string
		// cfg configures the client that calls through the proxy.
		cfg *quota.Config
		// operator: the call is operator work, so the client through the
		// proxy connects as the operator's role (pgtest.ConnectOperator).
		operator bool
		// prepare runs on the direct client before the call.
		prepare func(t *testing.T, b *testBundle) any
		// call runs through the proxy, which loses its reply.
		call func(ctx context.Context, c *quota.Client, prepared any) error
		// landed reports, on the direct connection, that the write is there.
		landed func(t *testing.T, b *testBundle, prepared any) bool
	}{
		{
			name: "Grant without a key",
			prepare: func(t *testing.T, b *testBundle) any {
				b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
				return nil
			},
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				sum, _ := b.usageRows(t, "q", "m")
				return sum == 3
			},
		},
		{
			name: "Acquire",
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				l, err := leaseOf(t, b.client).Get(b.ctx, "job")
				require.NoError(t, err)
				return l.Held && l.Holder == "a"
			},
		},
		{
			name: "WriteFencedRow",
			prepare: func(t *testing.T, b *testBundle) any {
				return b.acquire(t, "res", "a", time.Minute)
			},
			call: func(ctx context.Context, c *quota.Client, prepared any) error {
				l := prepared.(lease.Lease)
				_, err := fenceOf(t, c).WriteRow(ctx, fence.WriteRowRequest{Resource: "res", Key: "k", Value: "v1", Token: l.Token, Lease: "res"})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				r, err := fenceOf(t, b.client).Row(b.ctx, "res", "k")
				require.NoError(t, err)
				return r.Value == "v1"
			},
		},
		{
			name: "CompensateGrant",
			prepare: func(t *testing.T, b *testBundle) any {
				b.define(t, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
				r, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 4, Idempotency: key("order-1")})
				require.NoError(t, err)
				require.True(t, r.Granted)
				return r.GrantID
			},
			call: func(ctx context.Context, c *quota.Client, prepared any) error {
				_, err := c.CompensateGrant(ctx, prepared.(int64))
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				sum, _ := b.usageRows(t, "q", "m")
				return sum == 0
			},
		},
		{
			name: "Claim counted",
			prepare: func(t *testing.T, b *testBundle) any {
				_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "launch", 5)
				require.NoError(t, err)
				return nil
			},
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: "launch", Member: "alice"})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				p, err := voucherOf(t, b.client).Campaign(b.ctx, "launch")
				require.NoError(t, err)
				return p.Claimed == 1
			},
		},
		{
			name: "Enqueue",
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := outboxOf(t, c).Enqueue(ctx, "mail", []byte(`{"to":"alice"}`), nil)
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				return b.countRows(t, "outbox") == 1
			},
		},
		{
			name: "Grant coalesced",
			cfg:  &quota.Config{Grouping: quota.GroupByCounter},
			prepare: func(t *testing.T, b *testBundle) any {
				b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
				return nil
			},
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 2})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				sum, _ := b.usageRows(t, "q", "m")
				return sum == 2
			},
		},
		{
			name:     "DefineQuota",
			operator: true,
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := c.DefineQuota(ctx, quota.Definition{Name: "new", Window: quota.WindowHour, DefaultLimit: ptr[int64](5)})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				q, err := b.client.Quota(b.ctx, "new")
				return err == nil && q.Name == "new"
			},
		},
		{
			name:     "ReapLeases",
			operator: true,
			prepare: func(t *testing.T, b *testBundle) any {
				l := b.acquire(t, "old", "a", time.Minute)
				_, err := leaseOf(t, b.client).Release(b.ctx, lease.Lease{Name: "old", Token: l.Token})
				require.NoError(t, err)
				_, err = b.owner.Exec(b.ctx, `UPDATE pgquota.lease SET expires_at = clock_timestamp() - interval '2 hours' WHERE name = 'old'`)
				require.NoError(t, err)
				return nil
			},
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := leaseOf(t, c).Reap(ctx, lease.ReapRequest{OlderThan: time.Hour})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				_, err := leaseOf(t, b.client).Get(b.ctx, "old")
				return errors.Is(err, lease.ErrNotFound)
			},
		},
		{
			name:     "CreateShardedCampaign (the COMMIT's reply)",
			operator: true,
			dropTag:  "COMMIT",
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := voucherOf(t, c).CreateShardedCampaign(ctx, "big", 100, 4)
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				p, err := voucherOf(t, b.client).Campaign(b.ctx, "big")
				return err == nil && p.Total == 100
			},
		},
		{
			name:    "GrantBatch with keys (the COMMIT's reply)",
			dropTag: "COMMIT",
			prepare: func(t *testing.T, b *testBundle) any {
				b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})
				return nil
			},
			call: func(ctx context.Context, c *quota.Client, _ any) error {
				_, err := c.GrantBatch(ctx, []quota.GrantRequest{
					{Quota: "q", Member: "m", Amount: 2, Idempotency: key("b1")},
					{Quota: "q", Member: "n", Amount: 1, Idempotency: key("b2")},
				})
				return err
			},
			landed: func(t *testing.T, b *testBundle, _ any) bool {
				sum, _ := b.usageRows(t, "q", "m")
				return sum == 2 && b.ledgerRows(t) == 2
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.NewURL(t)
			direct := pgtest.Connect(t, dbURL, 4)
			client, err := quota.New(direct, nil)
			require.NoError(t, err)
			b := &testBundle{ctx: context.Background(), pool: direct, client: client, operator: operatorOf(t, client), owner: pgtest.ConnectOwner(t, dbURL, 1)}
			var prepared any
			if tc.prepare != nil {
				prepared = tc.prepare(t, b)
			}

			u, err := url.Parse(dbURL)
			require.NoError(t, err)
			proxy := newTagDropper(t, u.Host, tc.dropTag)
			u.Host = proxy.Ln.Addr().String()
			connect := pgtest.Connect
			if tc.operator {
				connect = pgtest.ConnectOperator
			}
			viaProxy, err := quota.New(connect(t, u.String(), 1), tc.cfg)
			require.NoError(t, err)
			// The reply dropped must be the call's own statement's, not
			// that of the quota-kind lookup a Client makes before its first
			// grant on a quota.
			rows, err := direct.Query(b.ctx, `SELECT name FROM pgquota.quota`)
			require.NoError(t, err)
			names, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.NoError(t, quota.WarmKinds(b.ctx, viaProxy, names...))

			proxy.Armed.Store(true)
			err = tc.call(b.ctx, viaProxy, prepared)
			select {
			case <-proxy.Dropped:
			default:
				t.Fatalf("the proxy dropped no reply; the call returned %v", err)
			}
			require.ErrorIs(t, err, quota.ErrOutcomeUnknown, "a reply lost after the commit leaves the outcome unknown: %v", err)
			var netErr net.Error
			// pgx reports a lost simple-protocol reply (the COMMIT's) as
			// pgconn.ErrConnClosed.
			require.True(t, errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed),
				"the original error stays in the chain: %v", err)
			require.Contains(t, err.Error(), "outcome unknown")
			b.settle(t)
			require.True(t, tc.landed(t, b, prepared), "the call committed although its reply was lost")
		})
	}
}

// Errors after which nothing was written are not outcome-unknown: a
// connection that could not be made, a context that had ended before the
// call, an error the server reported for the statement.
func TestOutcomeKnownWhenNothingWasSent(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](10)})

	// A port nobody listens on: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	u, err := url.Parse(pgtest.NewURL(t))
	require.NoError(t, err)
	u.Host = closed
	refused, err := quota.New(pgtest.Connect(t, u.String(), 1), nil)
	require.NoError(t, err)
	_, err = refused.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.Error(t, err)
	var connectErr *pgconn.ConnectError
	require.ErrorAs(t, err, &connectErr)
	require.NotErrorIs(t, err, quota.ErrOutcomeUnknown, "nothing was sent: %v", err)
	_, err = leaseOf(t, refused).Acquire(b.ctx, lease.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
	require.Error(t, err)
	require.NotErrorIs(t, err, quota.ErrOutcomeUnknown)
	_, err = outboxOf(t, refused).Enqueue(b.ctx, "mail", []byte("x"), nil)
	require.Error(t, err)
	require.NotErrorIs(t, err, quota.ErrOutcomeUnknown)

	// A context that had ended before the call.
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err = b.client.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, quota.ErrOutcomeUnknown)

	// The server's own error for the statement: rolled back.
	_, err = b.owner.Exec(b.ctx, `ALTER TABLE pgquota.outbox ADD CONSTRAINT test_no_spam CHECK (topic <> 'spam')`)
	require.NoError(t, err)
	_, err = outboxOf(t, b.client).Enqueue(b.ctx, "spam", []byte("x"), nil)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23514", pgErr.Code)
	require.NotErrorIs(t, err, quota.ErrOutcomeUnknown)
	require.Zero(t, b.countRows(t, "outbox"))

	sum, _ := b.usageRows(t, "q", "m")
	require.Zero(t, sum)
}
