// Package testbundle is the harness of the tests of package quota and of the
// capability packages (quota/outbox, ...): a client on a fresh migrated
// database (internal/pgtest), the clients the operator's and the relay's
// work go through (as their own roles under PGQUOTA_TEST_APP_ROLE=1), and
// helpers that read and pin what tests check.
package testbundle

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// Bundle is one test's database and clients.
type Bundle struct {
	Ctx context.Context
	// pool and client are the application's: as pgtest.AppLogin under
	// PGQUOTA_TEST_APP_ROLE=1.
	Pool   *pgxpool.Pool
	Client *quota.Client
	// operator is the client for operator work (DefineQuota,
	// SetMemberLimit, CreateCampaign, ImportCodes, BumpLeaseEpoch,
	// ReapLeases, ReapLedger and the like; see OperatorOf): client itself
	// in the normal pass, a client as pgtest.OperatorLogin under
	// PGQUOTA_TEST_APP_ROLE=1.
	Operator *quota.Client
	// owner is a pool on the same database as its owner: for the DDL a
	// test runs on purpose (pinning pgquota.clock, say), which the
	// application role of PGQUOTA_TEST_APP_ROLE=1 may not run.
	Owner *pgxpool.Pool
}

// Setup returns a client on a fresh migrated database whose pool holds at
// most maxConns connections (0 for the harness default). Under
// PGQUOTA_TEST_POOLER the pool goes through PgBouncer in transaction mode
// and the client is configured for it (Config).
func Setup(t *testing.T, maxConns int32) *Bundle {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	pool := pgtest.Connect(t, pgtest.PoolURL(t, dbURL), maxConns)
	client, err := quota.New(pool, Config(t, nil))
	require.NoError(t, err)
	return &Bundle{Ctx: context.Background(), Pool: pool, Client: client, Operator: OperatorOf(t, client), Owner: pgtest.ConnectOwner(t, dbURL, 2)}
}

// RoleConns bounds the pools OperatorOf and RelayOf open under
// PGQUOTA_TEST_APP_ROLE=1: operator work is one call at a time, and a
// test's relays are few.
const RoleConns = 2

// OperatorOf returns the client that operator work on c's database goes
// through (the functions of the 'pgquota_operator' rows of
// pgquota.function_grant: DefineQuota, SetMemberLimit, ClearMemberLimit,
// CreateCampaign, CreateShardedCampaign, ImportCodes, BumpLeaseEpoch,
// GuardTable, ReapLeases, ReapLedger and their Tx variants). In the normal
// pass that is c itself, so the pass keeps its meaning; under
// PGQUOTA_TEST_APP_ROLE=1, where c's pool connects as the application
// role, it is a new client (Config) on a pool of RoleConns connections
// to the same database (c's pool's URL) as pgtest.OperatorLogin, closed
// when t ends. A *Tx variant's transaction must come from its Pool().
func OperatorOf(t testing.TB, c *quota.Client) *quota.Client {
	t.Helper()
	return roleClient(t, c, pgtest.ConnectOperator, nil, RoleConns)
}

// RelayOf is OperatorOf for the relay's work (outbox NewRelay and Reap: the
// 'pgquota_relay' rows), as pgtest.RelayLogin under
// PGQUOTA_TEST_APP_ROLE=1.
func RelayOf(t testing.TB, c *quota.Client) *quota.Client {
	t.Helper()
	return roleClient(t, c, pgtest.ConnectRelay, nil, RoleConns)
}

// RelayWith is RelayOf with the relay client's config (cfg goes through
// Config) and its pool's size under PGQUOTA_TEST_APP_ROLE=1; c itself
// in the normal pass, which must then have been made with cfg.
func RelayWith(t testing.TB, c *quota.Client, cfg *quota.Config, maxConns int32) *quota.Client {
	t.Helper()
	return roleClient(t, c, pgtest.ConnectRelay, cfg, maxConns)
}

func roleClient(t testing.TB, c *quota.Client, connect func(testing.TB, string, int32) *pgxpool.Pool, cfg *quota.Config, maxConns int32) *quota.Client {
	t.Helper()
	if !pgtest.AppRoleMode() {
		return c
	}
	rc, err := quota.New(connect(t, c.Pool().Config().ConnString(), maxConns), Config(t, cfg))
	if err != nil {
		t.Fatalf("a client for the role's work under %s=1: %v", pgtest.EnvAppRole, err)
	}
	return rc
}

// Config returns cfg (nil for the defaults) with Pooler set to
// PoolerTransaction when the test's pools go through a transaction pooler
// (pgtest.Pooled).
func Config(t testing.TB, cfg *quota.Config) *quota.Config {
	t.Helper()
	if !pgtest.Pooled(t) {
		return cfg
	}
	var c quota.Config
	if cfg != nil {
		c = *cfg
	}
	c.Pooler = quota.PoolerTransaction
	return &c
}

// OwnerClient returns a client on the owner pool, for calls that run DDL
// on purpose (fence.Client.GuardTable creates a trigger on an application table).
func (b *Bundle) OwnerClient(t *testing.T) *quota.Client {
	t.Helper()
	c, err := quota.New(b.Owner, nil)
	require.NoError(t, err)
	return c
}

// AppDDL runs DDL an application would run as the owner of its own
// tables (on purpose: the role of PGQUOTA_TEST_APP_ROLE=1 may not), then
// gives b.Pool's role the use of schemas and tables, as an application's
// own role would have.
func (b *Bundle) AppDDL(t *testing.T, ddl string, schemas []string, tables ...string) {
	t.Helper()
	_, err := b.Owner.Exec(b.Ctx, ddl)
	require.NoError(t, err)
	var role string
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT quote_ident(current_user)`).Scan(&role))
	for _, s := range schemas {
		_, err := b.Owner.Exec(b.Ctx, `GRANT USAGE ON SCHEMA `+s+` TO `+role)
		require.NoError(t, err)
	}
	for _, tb := range tables {
		_, err := b.Owner.Exec(b.Ctx, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON `+tb+` TO `+role)
		require.NoError(t, err)
	}
}

// Define defines a quota or fails the test.
func (b *Bundle) Define(t *testing.T, d quota.Definition) quota.Quota {
	t.Helper()
	q, err := b.Operator.DefineQuota(b.Ctx, d)
	require.NoError(t, err)
	return q
}

// UsageRows returns the sum of used over every counter row of a quota and
// member, and the number of rows.
func (b *Bundle) UsageRows(t *testing.T, quotaName, member string) (sum, rows int64) {
	t.Helper()
	err := b.Pool.QueryRow(b.Ctx, `
		SELECT coalesce(sum(used), 0), count(*) FROM pgquota.usage
		WHERE quota_name = $1 AND member = $2`, quotaName, member).Scan(&sum, &rows)
	require.NoError(t, err)
	return sum, rows
}

// CountRows counts the rows of a pgquota table.
func (b *Bundle) CountRows(t *testing.T, table string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pgquota.`+table).Scan(&n))
	return n
}

// SetClock pins pgquota.clock() in this test's database to at.
func (b *Bundle) SetClock(t *testing.T, at string) {
	t.Helper()
	_, err := b.Owner.Exec(b.Ctx, `CREATE OR REPLACE FUNCTION pgquota.clock() RETURNS timestamptz
		LANGUAGE sql VOLATILE AS $$ SELECT '`+at+`'::timestamptz $$`)
	require.NoError(t, err)
}

// Concurrently runs fn(0) to fn(n-1) in n goroutines released at once, and
// waits for them all.
func Concurrently(n int, fn func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			start.Wait()
			fn(i)
		}()
	}
	start.Done()
	done.Wait()
}

// WaitFor polls cond until it holds, failing the test after 20s.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ExampleDatabase creates an empty scratch database on the server named by
// PGQUOTA_TEST_DATABASE_URL and returns its URL and a function that drops
// it. (An Example cannot use the test harness, which needs a *testing.T.)
func ExampleDatabase(ctx context.Context) (string, func()) {
	base := os.Getenv("PGQUOTA_TEST_DATABASE_URL")
	if base == "" {
		log.Fatal("set PGQUOTA_TEST_DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("pgquota_example_%d", os.Getpid())
	for _, stmt := range []string{"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)", "CREATE DATABASE " + name} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			log.Fatal(err)
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		log.Fatal(err)
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = conn.Close(ctx)
	}
}

// ExampleClient returns a client on a fresh migrated scratch database, its
// pool, and the function that drops the database.
func ExampleClient(ctx context.Context) (*quota.Client, *pgxpool.Pool, func()) {
	dbURL, drop := ExampleDatabase(ctx)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	client, err := quota.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	return client, pool, func() { pool.Close(); drop() }
}

// LockWaits returns the number of sessions of the test's database waiting
// for a lock.
func (b *Bundle) LockWaits(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
	return n
}

// WaitForLockWaits waits until n sessions of the test's database wait for
// a lock.
func (b *Bundle) WaitForLockWaits(t *testing.T, n int) {
	t.Helper()
	WaitFor(t, fmt.Sprintf("%d lock waits", n), func() bool { return b.LockWaits(t) >= n })
}

// LookPgbench returns pgbench from $PATH, else from $PGQUOTA_PG_BIN; the
// test fails when neither has it.
func LookPgbench(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p
	}
	if dir := os.Getenv("PGQUOTA_PG_BIN"); dir != "" {
		p := filepath.Join(dir, "pgbench")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("pgbench is neither on $PATH nor in $PGQUOTA_PG_BIN: install PostgreSQL's client tools or set PGQUOTA_PG_BIN")
	return ""
}

// RunClients calls op b.N times in all from clients goroutines (i numbers
// the calls from 1), after connecting the pool's connections, and fails b
// on the first error.
func RunClients(b *testing.B, clients int, op func(ctx context.Context, i int64) error) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	b.ResetTimer()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					errOnce.Do(func() { b.Error(err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
}

// ReadCommitted begins a transaction at READ COMMITTED, whatever the
// database's default isolation level.
var ReadCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// LedgerRows returns the number of rows in the ledger and in its outcome
// table (they must always match).
func (b *Bundle) LedgerRows(t *testing.T) int64 {
	t.Helper()
	n, outcomes := b.CountRows(t, "ledger"), b.CountRows(t, "ledger_outcome")
	require.Equal(t, n, outcomes, "every ledger row has its outcome")
	return n
}

// leaseClients and fenceClients hold the lease and fence client of each
// quota client LeaseOf and FenceOf were given: one per quota client, as
// an application keeps one (a lease client's AcquireWait calls share its
// LISTEN connection).
var leaseClients, fenceClients sync.Map

// LeaseOf returns the lease client on c (package lease), the same one for
// every call with c.
func LeaseOf(t testing.TB, c *quota.Client) *lease.Client {
	t.Helper()
	if c == nil {
		t.Fatalf("LeaseOf: no quota client")
	}
	return LeasesOf(c)
}

// LeasesOf is LeaseOf for code without a testing.TB; c must not be nil.
func LeasesOf(c *quota.Client) *lease.Client {
	if l, ok := leaseClients.Load(c); ok {
		return l.(*lease.Client)
	}
	l, err := lease.New(c)
	if err != nil {
		panic(err)
	}
	v, _ := leaseClients.LoadOrStore(c, l)
	return v.(*lease.Client)
}

// FencesOf is FenceOf for code without a testing.TB; c must not be nil.
func FencesOf(c *quota.Client) *fence.Client {
	if f, ok := fenceClients.Load(c); ok {
		return f.(*fence.Client)
	}
	f, err := fence.New(c)
	if err != nil {
		panic(err)
	}
	v, _ := fenceClients.LoadOrStore(c, f)
	return v.(*fence.Client)
}

// FenceOf returns the fence client on c (package fence), the same one for
// every call with c.
func FenceOf(t testing.TB, c *quota.Client) *fence.Client {
	t.Helper()
	if c == nil {
		t.Fatalf("FenceOf: no quota client")
	}
	return FencesOf(c)
}

// WaitForLockWait waits until some session of the test's database waits
// for a lock.
func (b *Bundle) WaitForLockWait(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := b.Pool.QueryRow(b.Ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

// Roles is a migrated database with a client per pgquota role: App (a
// LOGIN member of pgquota_app only), Relay (pgquota_relay only), Operator
// (pgquota_operator), and the owner.
type Roles struct {
	Ctx               context.Context
	App, Relay, Owner *pgxpool.Pool
	AppC, RelayC, OpC *quota.Client
	OperatorPool      *pgxpool.Pool
}

// RoleSetup returns a fresh migrated database's Roles.
func RoleSetup(t *testing.T) *Roles {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.NewURL(t)
	b := &Roles{
		Ctx:          ctx,
		App:          pgtest.Connect(t, pgtest.AppURL(t, dbURL), 4),
		Relay:        pgtest.Connect(t, pgtest.RelayURL(t, dbURL), 2),
		OperatorPool: pgtest.Connect(t, pgtest.OperatorURL(t, dbURL), 2),
		Owner:        pgtest.ConnectOwner(t, dbURL, 2),
	}
	var err error
	b.AppC, err = quota.New(b.App, nil)
	require.NoError(t, err)
	b.RelayC, err = quota.New(b.Relay, nil)
	require.NoError(t, err)
	b.OpC, err = quota.New(b.OperatorPool, nil)
	require.NoError(t, err)
	return b
}
