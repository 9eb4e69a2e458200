package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// ctx ends while COMMIT runs (a deferred constraint trigger makes COMMIT
// take 2 s): RunTx's error must be ErrOutcomeUnknown, or else nothing
// may have been committed.
func TestRunTxContextEndsDuringCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	g := b.guardReports(t, "orders", false)
	b.appDDL(t, `
		CREATE FUNCTION public.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON public.orders
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.slow_commit();`, nil)
	l := b.acquire(t, g.Resource, "A", time.Minute)

	ctx, cancel := context.WithCancel(b.ctx)
	time.AfterFunc(700*time.Millisecond, cancel)
	start := time.Now()
	err := b.fences.RunTx(ctx, fence.TxRequest{Resource: g.Resource, Token: l.Token}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, val) VALUES (1, 'a')`)
		return err
	})
	took := time.Since(start)
	time.Sleep(3 * time.Second)
	rows := b.rowsOf(t, "orders")
	t.Logf("RunTx returned after %v: %v (outcome unknown: %v); rows %q", took, err, errors.Is(err, quota.ErrOutcomeUnknown), rows)
	require.Error(t, err)
	if !errors.Is(err, quota.ErrOutcomeUnknown) {
		require.Empty(t, rows, "an error without ErrOutcomeUnknown means nothing committed")
	}
}
