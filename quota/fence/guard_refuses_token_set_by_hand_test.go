package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota/fence"
)

// On a table guarded for external tokens, a token put into the guard's
// setting by hand, equal to the highest seen (readable by anyone who may
// SELECT pgquota.fence), is refused with PQ003: the guard takes only a
// token present_token admitted in this very transaction. Neither the old
// form of the setting nor a copy of a real presentation's setting from an
// earlier transaction passes, nor a setting that claims another token
// with a real proof; and a role that may read pgquota.fence and the
// guards, but not pgquota's key, cannot forge one either.
func TestGuardRefusesTokenSetByHand(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "ext", true)
	require.NoError(t, b.txWith(t, g.Resource, 1000, `INSERT INTO ext VALUES (1, 'real', NULL)`))

	forged := func(x interface {
		Begin(context.Context) (pgx.Tx, error)
	}, role, setting string) error {
		tx, err := x.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
		if role != "" {
			_, err = tx.Exec(b.ctx, `SET LOCAL ROLE `+role)
			require.NoError(t, err)
		}
		_, err = tx.Exec(b.ctx, `SELECT set_config('pgquota.fence_tokens', $1, true)`, setting)
		require.NoError(t, err)
		if _, err := tx.Exec(b.ctx, `UPDATE ext SET val = 'forged' WHERE id = 1`); err != nil {
			return err
		}
		return tx.Commit(b.ctx)
	}

	// The forgery: the highest token seen, set by hand.
	err := forged(b.pool, "", `{"public.ext": 1000}`)
	requireSQLState(t, err, fence.SQLStateTokenNotPresented, "the old form of the setting")
	require.Equal(t, "1:real:1000", b.rowsOf(t, "ext"))

	// The setting of a real presentation, taken from its transaction.
	var real string
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if err := b.fences.PresentTokenTx(b.ctx, tx, fence.PresentTokenRequest{Resource: g.Resource, Token: 1000}); err != nil {
			return err
		}
		return tx.QueryRow(b.ctx, `SELECT current_setting('pgquota.fence_tokens')`).Scan(&real)
	}))
	require.Contains(t, real, `"proof"`)
	var otherToken string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT jsonb_set($1::jsonb, '{public.ext,token}', '1001')::text`, real).Scan(&otherToken))

	for name, setting := range map[string]string{
		"the old form":             `{"public.ext": 1000}`,
		"no proof":                 `{"public.ext": {"token": 1000}}`,
		"an invented proof":        `{"public.ext": {"token": 1000, "proof": "00"}}`,
		"an earlier transaction's": real,
		"another token's claim":    otherToken,
	} {
		err := forged(b.pool, "", setting)
		requireSQLState(t, err, fence.SQLStateTokenNotPresented, name)
		require.ErrorIs(t, fence.MapError(err), fence.ErrTokenNotPresented, name)
	}

	// A role with SELECT on pgquota.fence and the guards, and DML on the
	// table only.
	role := fmt.Sprintf("pgquota_fence_reader_%d", time.Now().UnixNano())
	// Roles are the server's: created as the server URL's role, and made
	// one the owner may SET ROLE to.
	su, err := pgx.Connect(b.ctx, pgtest.BaseURL(t))
	require.NoError(t, err)
	defer func() { _ = su.Close(context.WithoutCancel(b.ctx)) }()
	var owner string
	require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT quote_ident(current_user)`).Scan(&owner))
	_, err = su.Exec(b.ctx, fmt.Sprintf(`CREATE ROLE %s NOLOGIN; GRANT %[1]s TO %s`, role, owner))
	require.NoError(t, err, "the server URL's role creates roles")
	_, err = b.owner.Exec(b.ctx, fmt.Sprintf(`
		GRANT USAGE ON SCHEMA pgquota TO %[1]s;
		GRANT SELECT ON pgquota.fence, pgquota.fence_guard_resource TO %[1]s;
		GRANT SELECT, UPDATE ON public.ext TO %[1]s`, role))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.owner.Exec(context.Background(), fmt.Sprintf(`REVOKE ALL ON public.ext FROM %s; REVOKE ALL ON pgquota.fence, pgquota.fence_guard_resource FROM %[1]s;
			REVOKE ALL ON SCHEMA pgquota FROM %[1]s`, role))
		if su, err := pgx.Connect(context.Background(), pgtest.BaseURL(t)); err == nil {
			_, _ = su.Exec(context.Background(), `DROP ROLE `+role)
			_ = su.Close(context.Background())
		}
	})
	var highest int64
	require.NoError(t, b.owner.QueryRow(b.ctx, `SELECT max_token FROM pgquota.fence WHERE resource = 'public.ext'`).Scan(&highest))
	// The guard runs as the writer (it handles the writer's row), and its
	// proof check is an API function of pgquota_app: a role outside it is
	// refused with 42501 before any proof is read; either way nothing lands.
	err = forged(b.owner, role, fmt.Sprintf(`{"public.ext": %d}`, highest))
	require.Error(t, err)
	require.Contains(t, []string{fence.SQLStateTokenNotPresented, "42501"}, pgCode(err), "%v", err)
	var tx pgx.Tx
	tx, err = b.owner.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
	_, err = tx.Exec(b.ctx, `SET LOCAL ROLE `+role)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT secret FROM pgquota.fence_secret`)
	requireSQLState(t, err, "42501", "the key is not readable")
	require.NoError(t, tx.Rollback(b.ctx))

	require.Equal(t, "1:real:1000", b.rowsOf(t, "ext"))
}
