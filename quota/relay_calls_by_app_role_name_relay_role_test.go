package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/outbox"
)

// The relay's work (outbox claim, mark delivered, reap: the
// 'pgquota_relay' rows of pgquota.function_grant), run as the application
// role, fails with ErrPermissionDenied and a message that names the relay
// role and the command that grants it (grant-relay), not grant-app or the
// operator's command; and the event stays pending for a relay that may.
func TestRelayCallsByAppRoleNameRelayRoleAndGrantRelay(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	app := outboxOf(t, b.appC)
	_, err := app.Enqueue(ctx, "t", []byte("x"), nil)
	require.NoError(t, err)

	r, err := app.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.RelayConfig{Topics: []string{"t"}})
	require.NoError(t, err)
	_, runErr := r.RunOnce(ctx)
	_, reapErr := app.Reap(ctx, time.Hour)
	for name, err := range map[string]error{"Relay.RunOnce": runErr, "outbox.Reap": reapErr} {
		t.Logf("%s as the app role: %v", name, err)
		require.ErrorIs(t, err, quota.ErrPermissionDenied, name)
		require.Equal(t, "42501", pgCode(err), name)
		require.Contains(t, err.Error(), "pgquota migrate grant-relay --role", name)
		require.Contains(t, err.Error(), "pgquota_relay", name)
		require.NotContains(t, err.Error(), "grant-app", name)
		require.NotContains(t, err.Error(), "grant-operator", name)
	}
	st, err := app.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Pending, "the refused relay claimed nothing")
}
