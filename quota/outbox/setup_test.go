package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// testBundle is one test's database and clients (testbundle.Bundle), with
// the outbox client on the application's quota client.
type testBundle struct {
	*testbundle.Bundle
	ctx    context.Context
	pool   *pgxpool.Pool
	client *quota.Client
	events *outbox.Client
}

func setup(t *testing.T, maxConns int32) *testBundle {
	t.Helper()
	tb := testbundle.Setup(t, maxConns)
	return &testBundle{Bundle: tb, ctx: tb.Ctx, pool: tb.Pool, client: tb.Client, events: outboxOf(t, tb.Client)}
}

// outboxOf returns the outbox client on c.
func outboxOf(t testing.TB, c *quota.Client) *outbox.Client {
	t.Helper()
	o, err := outbox.New(c)
	require.NoError(t, err)
	return o
}

// relayOf returns the outbox client for the relay's work on c's database
// (testbundle.RelayOf: as the relay role under PGQUOTA_TEST_APP_ROLE=1).
func relayOf(t testing.TB, c *quota.Client) *outbox.Client {
	t.Helper()
	return outboxOf(t, testbundle.RelayOf(t, c))
}

// relayWith is relayOf with the relay client's config and pool size
// (testbundle.RelayWith).
func relayWith(t testing.TB, c *quota.Client, cfg *quota.Config, maxConns int32) *outbox.Client {
	t.Helper()
	return outboxOf(t, testbundle.RelayWith(t, c, cfg, maxConns))
}

func ptr[T any](v T) *T { return &v }

func key(k string) quota.IdempotencyKey { return quota.IdempotencyKey{Key: k} }
