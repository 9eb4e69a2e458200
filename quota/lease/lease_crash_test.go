package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/fencedgrant"
	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// TestLeaseCallsSurviveImmediateShutdownUnderAsyncCommit proves that an
// acquire, renew, release, fenced write (also in the caller's transaction),
// write of a table with the fence guard and fenced grant that reported
// success survive
// an immediate shutdown of the server, and that no token is issued twice,
// when synchronous_commit = off is set for the database or for the role
// (the PostgreSQL manual, 30.4: an asynchronous commit is reported before
// its WAL is flushed, and a crash loses it). Each round runs the calls
// right after a checkpoint, on a server whose WAL writer sleeps 10s, then
// shuts the server down in immediate mode, restarts it, checks every
// reported outcome, and lets a newcomer acquire.
func TestLeaseCallsSurviveImmediateShutdownUnderAsyncCommit(t *testing.T) {
	t.Parallel()
	rounds := 20
	if s := os.Getenv(envCrashRounds); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "%s=%q", envCrashRounds, s)
		rounds = n
	}
	ctx := context.Background()
	cl := pgcluster.New(t, "crash", pgcluster.Options{"wal_writer_delay": "'10s'"})
	cl.CreateDatabase("async_db")
	cl.CreateDatabase("async_role")
	cl.Exec("postgres", `ALTER DATABASE async_db SET synchronous_commit = off;
		CREATE ROLE app_async LOGIN;
		ALTER ROLE app_async SET synchronous_commit = off`)
	// The operator's role (migration 00022: the API's and the operator's
	// functions, no table writes): the test also defines a quota.
	cl.Exec("async_role", `GRANT pgquota_operator TO app_async`)
	for _, database := range []string{"async_db", "async_role"} {
		cl.Exec(database, `CREATE TABLE public.reports (id int PRIMARY KEY, val text NOT NULL, tok bigint);
			GRANT SELECT, INSERT, UPDATE, DELETE ON public.reports TO app_async`)
		admin, closeAdmin := crashClient(t, cl.URL(database))
		// External: each round writes with the token of that round's own
		// lease (held-N), which a table bound to one lease would refuse
		// (PQ004); the mark still refuses any token below the highest seen.
		_, err := fenceOf(t, admin).GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "tok", External: true})
		require.NoError(t, err)
		closeAdmin()
	}
	targets := []struct{ what, database, url string }{
		{"ALTER DATABASE ... SET synchronous_commit = off", "async_db", cl.URL("async_db")},
		{"ALTER ROLE ... SET synchronous_commit = off (a role without superuser)", "async_role", cl.URL("async_role", "app_async")},
	}

	// Every token a call reported, per database (each has its own
	// sequence), and by which call.
	type dbToken struct {
		database string
		token    int64
	}
	issued := map[dbToken]string{}
	var lost, twice int
	var database string
	record := func(tok int64, by string) {
		k := dbToken{database, tok}
		if prev, ok := issued[k]; ok {
			twice++
			t.Errorf("token %d issued twice in database %s: to %s and to %s", tok, database, prev, by)
			return
		}
		issued[k] = by
	}
	for round := range rounds {
		tg := targets[round%len(targets)]
		database = tg.database
		cl.Exec(tg.database, "CHECKPOINT")
		client, closePool := crashClient(t, tg.url)
		var sc string
		require.NoError(t, client.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc))
		require.Equal(t, "off", sc, "round %d: the setting under test is in force (%s)", round, tg.what)

		name := func(s string) string { return fmt.Sprintf("%s-%d", s, round) }
		held, err := leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: name("held"), Holder: "A", TTL: time.Hour})
		require.NoError(t, err)
		record(held.Token, name("held")+" (A)")
		rel, err := leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: name("released"), Holder: "A", TTL: time.Hour})
		require.NoError(t, err)
		record(rel.Token, name("released"))
		_, err = leaseOf(t, client).Release(ctx, rel)
		require.NoError(t, err)
		ren, err := leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: name("renewed"), Holder: "A", TTL: time.Minute})
		require.NoError(t, err)
		record(ren.Token, name("renewed"))
		ren, err = leaseOf(t, client).Renew(ctx, ren, 2*time.Hour)
		require.NoError(t, err)
		_, err = fenceOf(t, client).WriteRow(ctx, fence.WriteRowRequest{Resource: held.Name, Key: "k", Value: name("v"), Token: held.Token, Lease: held.Name})
		require.NoError(t, err)
		// A write of the application's own table with the fence guard.
		require.NoError(t, guardedWrite(ctx, client.Pool(), round, name("v"), held.Token, ""))
		// The Tx variants, in the caller's transaction.
		tx, err := client.Pool().Begin(ctx)
		require.NoError(t, err)
		inTx, err := leaseOf(t, client).AcquireTx(ctx, tx, lease.AcquireRequest{Name: name("tx"), Holder: "A", TTL: time.Hour})
		require.NoError(t, err)
		_, err = fenceOf(t, client).WriteRowTx(ctx, tx, fence.WriteRowRequest{Resource: inTx.Name, Key: "k", Value: name("v"), Token: inTx.Token, Lease: inTx.Name})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		record(inTx.Token, name("tx"))
		// Every other pair of rounds, a fenced grant too: its lease, its
		// fenced counter write, its release. (Its WAL fills pages, and a
		// full page wakes the WAL writer, which then writes the first
		// records of the round, the sequence's among them: the other rounds
		// show tokens issued twice more often.)
		granted := round%4 >= 2
		if granted {
			_, err = client.DefineQuota(ctx, quota.Definition{Name: name("q"), Window: quota.WindowNone, DefaultLimit: ptr[int64](10)})
			require.NoError(t, err)
			g, err := fencedgrant.Grant(ctx, client, quota.GrantRequest{Quota: name("q"), Member: "m", Amount: 3}, time.Minute)
			require.NoError(t, err)
			require.True(t, g.Granted)
		}
		closePool()

		cl.Crash()
		cl.Start()

		client, closePool = crashClient(t, tg.url)
		check := func(ok bool, format string, args ...any) {
			if !ok {
				lost++
				t.Errorf("round %d (%s): lost after the crash: %s", round, tg.what, fmt.Sprintf(format, args...))
			}
		}
		for _, l := range []lease.Lease{held, inTx} {
			got, err := leaseOf(t, client).Get(ctx, l.Name)
			check(err == nil && got.Token == l.Token && got.Held, "acquire of %s with token %d (now: token %d, held %t, %v)", l.Name, l.Token, got.Token, got.Held, err)
			row, err := fenceOf(t, client).Row(ctx, l.Name, "k")
			check(err == nil && row.Token == l.Token, "fenced write of %s with token %d (now: token %d, %v)", l.Name, l.Token, row.Token, err)
		}
		var guardedTok int64
		err = client.Pool().QueryRow(ctx, "SELECT tok FROM public.reports WHERE id = $1", round).Scan(&guardedTok)
		check(err == nil && guardedTok == held.Token, "guarded write of row %d with token %d (now: %d, %v)", round, held.Token, guardedTok, err)
		if granted {
			u, err := client.Usage(ctx, name("q"), "m")
			check(err == nil && u.Used == 3, "fenced grant of 3 units on %s (now: %d used, %v)", name("q"), u.Used, err)
		}
		got, err := leaseOf(t, client).Get(ctx, rel.Name)
		check(err == nil && !got.Held, "release of %s (now: held %t, %v)", rel.Name, got.Held, err)
		got, err = leaseOf(t, client).Get(ctx, ren.Name)
		check(err == nil && got.ExpiresAt.Equal(ren.ExpiresAt), "renewal of %s to %s (now: expires %s, %v)", ren.Name, ren.ExpiresAt, got.ExpiresAt, err)

		// A newcomer: the held lease stays A's, and no token comes twice.
		b, err := leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: held.Name, Holder: "B", TTL: time.Hour})
		if err == nil {
			check(false, "A's lease %s (token %d) was acquired by B with token %d", held.Name, held.Token, b.Token)
			record(b.Token, held.Name+" (B, after the crash)")
		} else if !errors.Is(err, lease.ErrHeld) {
			require.NoError(t, err)
		}
		n, err := leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: name("newcomer"), Holder: "B", TTL: time.Hour})
		require.NoError(t, err)
		record(n.Token, name("newcomer")+" (after the crash)")
		closePool()
	}
	t.Logf("%d immediate shutdowns under synchronous_commit = off: %d tokens issued, %d issued twice, %d reported outcomes lost",
		rounds, len(issued)+twice, twice, lost)
}
