package fence_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// The guard trigger handles the application table's row (it stamps the
// presented token into the token column), so whatever that row's types run
// (a domain's CHECK, a cast of the application's own) runs with the
// writer's rights, never with the rights of pgquota's owner: a table owner
// who changes the token column to a domain whose CHECK calls its own
// function must not get the owner's (often a superuser's) privileges from a
// guarded write.
func TestGuardTriggerRunsAsTheWriter(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	ownerC, err := quota.New(b.owner, nil)
	require.NoError(t, err)
	for _, stmt := range []string{
		`CREATE SCHEMA appd`,
		`CREATE TABLE appd.w (id int PRIMARY KEY, v text, tok bigint)`,
		`CREATE TABLE appd.seen (who text NOT NULL)`,
		`GRANT USAGE ON SCHEMA appd TO pgquota_app`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON appd.w TO pgquota_app`,
		`GRANT INSERT ON appd.seen TO pgquota_app`,
	} {
		_, err := b.owner.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	g, err := fenceOf(t, ownerC).GuardTable(ctx, fence.GuardTableRequest{Table: "appd.w", Column: "tok"})
	require.NoError(t, err)
	// After the guard is attached (it refuses a domain column at attach
	// time), the column becomes a domain whose CHECK records who runs it.
	for _, stmt := range []string{
		`CREATE FUNCTION appd.who(bigint) RETURNS boolean LANGUAGE sql AS $$ INSERT INTO appd.seen VALUES (current_user) RETURNING true $$`,
		`CREATE DOMAIN appd.tokd AS bigint CHECK (appd.who(VALUE))`,
		`ALTER TABLE appd.w ALTER COLUMN tok TYPE appd.tokd`,
	} {
		_, err := b.owner.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	l, err := leaseOf(t, b.appC).Acquire(ctx, lease.AcquireRequest{Name: g.Resource, Holder: "writer", TTL: time.Minute})
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, b.app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgquota.present_token($1, $2)`, g.Resource, l.Token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO appd.w (id, v) VALUES (1, 'x')`)
		return err
	})
	require.NoError(t, err)
	var tok int64
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT tok FROM appd.w WHERE id = 1`).Scan(&tok))
	require.Equal(t, l.Token, tok, "the guard stamps the presented token")
	rows, err := b.owner.Query(ctx, `SELECT DISTINCT who FROM appd.seen ORDER BY who`)
	require.NoError(t, err)
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{pgtest.AppLogin}, who, "the domain's CHECK must run as the writer, not as pgquota's owner")
}

// A semaphore slot's lease is taken by the semaphore's acquire only: the
// session setting the slot trigger reads can be set by any client, and
// lease_acquire of a 'slot:' name is refused (PQ012) whatever it says, so
// no client takes a slot past the semaphore's limit or rewrites a held
// slot's holder.
func TestLeaseAcquireRefusesSlotNamesWhateverTheSessionSays(t *testing.T) {
	t.Parallel()
	b := roleSetup(t)
	ctx := b.ctx
	s, err := leaseOf(t, b.appC).AcquireSlot(ctx, lease.SlotRequest{Semaphore: "sem", Limit: 1, Holder: "h1", TTL: time.Minute})
	require.NoError(t, err)
	for _, name := range []string{"slot:sem:5", s.Lease.Name} {
		err := pgx.BeginFunc(ctx, b.app, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('pgquota.slot_taking', $1, true)`, name); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT * FROM pgquota.lease_acquire('1 hour', $1, 'evil', $2)`, name, s.Lease.Attempt)
			return err
		})
		require.Error(t, err, name)
		require.Equal(t, "PQ012", pgCode(err), "%s: %v", name, err)
	}
	var n int
	var holder string
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT count(*) FROM pgquota.lease WHERE starts_with(name, 'slot:sem:')`).Scan(&n))
	require.Equal(t, 1, n, "only the slot the semaphore granted")
	require.NoError(t, b.owner.QueryRow(ctx, `SELECT holder FROM pgquota.lease WHERE name = $1`, s.Lease.Name).Scan(&holder))
	require.Equal(t, "h1", holder)
}
