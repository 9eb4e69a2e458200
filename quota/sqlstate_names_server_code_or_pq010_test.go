package quota_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// SQLState is the server's code when a *pgconn.PgError is in the chain
// (also beside ErrQuotaNotFound), PQ010 for ErrQuotaNotFound learnt
// without one, and empty for any other error.
func TestSQLStateNamesTheServersCodeOrPQ010ForAnUnknownQuota(t *testing.T) {
	t.Parallel()
	deadlock := &pgconn.PgError{Code: "40P01"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("other"), ""},
		{fmt.Errorf("call: %w", deadlock), "40P01"},
		{fmt.Errorf("%w: %q", quota.ErrQuotaNotFound, "q"), quota.SQLStateQuotaNotFound},
		{fmt.Errorf("%w: %w", quota.ErrQuotaNotFound, deadlock), "40P01"},
	} {
		require.Equal(t, tc.want, quota.SQLState(tc.err), "%v", tc.err)
	}
}
