package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgcluster"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// TestGrantsSurviveImmediateShutdownUnderAsyncCommit proves that grants,
// keyed grants, batched grants, revokes, voucher claims (counted and code)
// and outbox events that reported success survive an immediate shutdown
// when synchronous_commit = off is set for the database (the PostgreSQL
// manual, 30.4: an asynchronous commit is reported before its WAL is
// flushed, and a crash loses it). A lost grant would leave the counter
// below the units handed out, so later grants would pass the limit: each
// of these statements makes its own commit durable (pgquota.durable_commit).
// Each round runs the calls right after a checkpoint, on a server whose WAL
// writer sleeps 10s, then crashes the server, restarts it and checks every
// reported outcome.
func TestGrantsSurviveImmediateShutdownUnderAsyncCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := pgcluster.New(t, "grantcrash", pgcluster.Options{"wal_writer_delay": "'10s'"})
	cl.CreateDatabase("async_db")
	cl.Exec("postgres", `ALTER DATABASE async_db SET synchronous_commit = off`)
	url := cl.URL("async_db")

	// Definitions, made durable by the checkpoint of the first round.
	const rounds = 4
	client, closePool := crashClient(t, url)
	_, err := client.DefineQuota(ctx, quota.Definition{Name: "credits", Window: quota.WindowNone, DefaultLimit: ptr[int64](1000)})
	require.NoError(t, err)
	_, err = voucherOf(t, client).CreateCampaign(ctx, "counted", 100)
	require.NoError(t, err)
	codes := make([]string, 20)
	for i := range codes {
		codes[i] = fmt.Sprintf("CODE-%02d", i)
	}
	_, err = voucherOf(t, client).ImportCodes(ctx, "codes", codes)
	require.NoError(t, err)
	closePool()

	var lost int
	for round := range rounds {
		cl.Exec("async_db", "CHECKPOINT")
		client, closePool := crashClient(t, url)
		var sc string
		require.NoError(t, client.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc))
		require.Equal(t, "off", sc, "the setting under test is in force")
		member := func(s string) string { return fmt.Sprintf("%s-%d", s, round) }

		g, err := client.Grant(ctx, quota.GrantRequest{Quota: "credits", Member: member("plain"), Amount: 2})
		require.NoError(t, err)
		require.True(t, g.Granted)
		k, err := client.Grant(ctx, quota.GrantRequest{Quota: "credits", Member: member("keyed"), Amount: 3,
			Idempotency: quota.IdempotencyKey{Key: member("k")}})
		require.NoError(t, err)
		require.True(t, k.Granted)
		revoked, err := client.Grant(ctx, quota.GrantRequest{Quota: "credits", Member: member("revoked"), Amount: 4,
			Idempotency: quota.IdempotencyKey{Key: member("r")}})
		require.NoError(t, err)
		require.True(t, revoked.Granted)
		_, err = client.CompensateGrant(ctx, revoked.GrantID)
		require.NoError(t, err)
		batch, err := client.GrantBatch(ctx, []quota.GrantRequest{
			{Quota: "credits", Member: member("batch-a"), Amount: 1},
			{Quota: "credits", Member: member("batch-b"), Amount: 5},
		})
		require.NoError(t, err)
		for _, o := range batch {
			require.NoError(t, o.Err)
			require.True(t, o.Granted)
		}
		counted, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "counted", Member: member("v")})
		require.NoError(t, err)
		require.True(t, counted.Claimed)
		code, err := voucherOf(t, client).Claim(ctx, voucher.ClaimRequest{Campaign: "codes", Member: member("v")})
		require.NoError(t, err)
		require.True(t, code.Claimed)
		event, err := outboxOf(t, client).Enqueue(ctx, "granted", []byte(member("e")), nil)
		require.NoError(t, err)
		closePool()

		cl.Crash()
		cl.Start()

		client, closePool = crashClient(t, url)
		check := func(ok bool, format string, args ...any) {
			if !ok {
				lost++
				t.Errorf("round %d: lost after the crash: %s", round, fmt.Sprintf(format, args...))
			}
		}
		for _, want := range []struct {
			member string
			used   int64
		}{{member("plain"), 2}, {member("keyed"), 3}, {member("revoked"), 0}, {member("batch-a"), 1}, {member("batch-b"), 5}} {
			u, err := client.Usage(ctx, "credits", want.member)
			check(err == nil && u.Used == want.used, "counter of %s: want %d used, have %d (%v)", want.member, want.used, u.Used, err)
		}
		e, err := client.LedgerEntry(ctx, k.GrantID)
		check(err == nil && e.GrantID == k.GrantID, "ledger entry %d of the keyed grant (%v)", k.GrantID, err)
		var n int
		require.NoError(t, client.Pool().QueryRow(ctx,
			`SELECT count(*) FROM pgquota.voucher_claim WHERE campaign = 'counted' AND member = $1`, member("v")).Scan(&n))
		check(n == 1, "counted claim of %s (%d rows)", member("v"), n)
		var holder string
		err = client.Pool().QueryRow(ctx, `SELECT coalesce(member, '') FROM pgquota.voucher_code WHERE campaign = 'codes' AND code = $1`, code.Code).Scan(&holder)
		check(err == nil && holder == member("v"), "code %s claimed by %s (held by %q, %v)", code.Code, member("v"), holder, err)
		require.NoError(t, client.Pool().QueryRow(ctx, `SELECT count(*) FROM pgquota.outbox WHERE id = $1`, event).Scan(&n))
		check(n == 1, "outbox event %d", event)
		closePool()
		// The crash and restart take the server's whole attention: give it
		// a moment before the next checkpoint.
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d immediate shutdowns under synchronous_commit = off: %d reported outcomes lost", rounds, lost)
}
