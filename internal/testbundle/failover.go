package testbundle

import (
	"context"
	"testing"

	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/stretchr/testify/require"
)

// FailoverPrimary starts a primary with database app migrated, role app
// (as TestLeaseTokensIncreaseAcrossFailoverToLaggingStandby has it) and
// table public.reports guarded on column tok by lease public.reports. It
// returns the cluster and an operator client (superuser postgres).
func FailoverPrimary(t *testing.T) (*pgcluster.Cluster, *quota.Client) {
	t.Helper()
	primary := pgcluster.New(t, "primary", nil)
	primary.CreateDatabase("app")
	primary.Exec("app", `CREATE ROLE app LOGIN;
		GRANT pgquota_operator TO app;
		CREATE TABLE public.reports (id int PRIMARY KEY, val text NOT NULL, tok bigint);
		GRANT SELECT, INSERT, UPDATE, DELETE ON public.reports TO app`)
	op, err := quota.New(pgcluster.Pool(t, primary.URL("app")), nil)
	require.NoError(t, err)
	_, err = FenceOf(t, op).GuardTable(context.Background(), fence.GuardTableRequest{Table: "public.reports", Column: "tok"})
	require.NoError(t, err)
	return primary, op
}

// FailoverClient opens a client on database app of cl as role app.
func FailoverClient(t *testing.T, cl *pgcluster.Cluster) *quota.Client {
	t.Helper()
	c, err := quota.New(pgcluster.Pool(t, cl.URL("app", "app")), nil)
	require.NoError(t, err)
	return c
}
