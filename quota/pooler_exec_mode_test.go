package quota_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// Behind a transaction pooler only pgx's exec and simple_protocol modes
// are safe; New refuses the others with an error that names pgx's
// DefaultQueryExecMode and what to set, and accepts every mode without the
// setting.
func TestPoolerTransactionRefusesUnsafeExecModes(t *testing.T) {
	t.Parallel()
	base := pgtest.BaseURL(t)
	pooler := &quota.Config{Pooler: quota.PoolerTransaction}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", ""} {
		t.Run("refused "+mode, func(t *testing.T) {
			u := base
			if mode != "" {
				u += "&default_query_exec_mode=" + mode
			}
			pool := pgtest.Connect(t, u, 1)
			_, err := quota.New(pool, pooler)
			require.ErrorIs(t, err, quota.ErrInvalidInput)
			want := mode
			if want == "" {
				want = "cache_statement" // pgx's default
			}
			require.ErrorContains(t, err, "DefaultQueryExecMode")
			require.ErrorContains(t, err, "is pgx.QueryExecMode")
			require.ErrorContains(t, err, "("+want)
			require.ErrorContains(t, err, "pgx.QueryExecModeExec")
			require.ErrorContains(t, err, "default_query_exec_mode=exec")

			c, err := quota.New(pool, nil)
			require.NoError(t, err, "without the pooler setting every mode is accepted")
			require.NotNil(t, c)
		})
	}
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run("accepted "+mode, func(t *testing.T) {
			pool := pgtest.Connect(t, base+"&default_query_exec_mode="+mode, 1)
			_, err := quota.New(pool, pooler)
			require.NoError(t, err)
		})
	}
	t.Run("bad setting", func(t *testing.T) {
		pool := pgtest.Connect(t, base+"&default_query_exec_mode=exec", 1)
		_, err := quota.New(pool, &quota.Config{Pooler: "statement"})
		var ie *quota.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, "Config.Pooler", ie.Field)
	})
	t.Run("parse", func(t *testing.T) {
		for in, want := range map[string]quota.PoolerMode{
			"": quota.PoolerNone, "none": quota.PoolerNone, "session": quota.PoolerNone,
			"transaction": quota.PoolerTransaction, " Transaction ": quota.PoolerTransaction,
		} {
			got, err := quota.ParsePoolerMode("--pooler", in)
			require.NoError(t, err, in)
			require.Equal(t, want, got, in)
		}
		for _, in := range []string{"statement", "tx", "1"} {
			_, err := quota.ParsePoolerMode("--pooler", in)
			require.ErrorIs(t, err, quota.ErrInvalidInput, in)
			require.ErrorContains(t, err, "--pooler", in)
		}
	})
	// The modes as pgx names them, so that the error's advice is what a
	// pgx user types.
	require.Equal(t, "exec", pgx.QueryExecModeExec.String())
}
