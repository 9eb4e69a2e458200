package voucher_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// One Claim call serves counted pools, sharded pools and code campaigns:
// two clients (replicas) that never saw the campaigns race 3 claims per
// member (a plain one, a keyed one and one inside ClaimTx) for 12 members
// on each campaign; each campaign hands out exactly its total, every
// member who got a voucher holds one (a repeat returns it), the others are
// sold out, and the keyed claims' ledger rows match.
func TestClaimOneCallServesEveryKind(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "counted", 5)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).CreateShardedCampaign(b.ctx, "sharded", 6, 3)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{"A", "B", "C", "D"})
	require.NoError(t, err)
	totals := map[string]int64{"counted": 5, "sharded": 6, "codes": 4}

	var clients []*quota.Client
	for range 2 {
		c, err := quota.New(b.pool, testConfig(t, nil))
		require.NoError(t, err)
		clients = append(clients, c)
	}
	const members = 12
	type out struct {
		campaign, member string
		res              voucher.ClaimResult
		err              error
	}
	var (
		mu   sync.Mutex
		outs []out
		wg   sync.WaitGroup
	)
	for campaign := range totals {
		for m := range members {
			for way := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := clients[(m+way)%2]
					member := fmt.Sprintf("m%d", m)
					req := voucher.ClaimRequest{Campaign: campaign, Member: member}
					var res voucher.ClaimResult
					var err error
					switch way {
					case 0:
						res, err = voucherOf(t, c).Claim(b.ctx, req)
					case 1:
						req.Idempotency = quota.IdempotencyKey{Key: "k-" + member}
						res, err = voucherOf(t, c).Claim(b.ctx, req)
					case 2:
						err = quota.RunInTx(b.ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
							res, err = voucherOf(t, c).ClaimTx(b.ctx, tx, req)
							return err
						})
					}
					mu.Lock()
					outs = append(outs, out{campaign, member, res, err})
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()

	held := map[string]map[string]string{} // campaign -> member -> voucher
	for _, o := range outs {
		require.NoError(t, o.err, "%s %s", o.campaign, o.member)
		require.Equal(t, o.campaign, o.res.Campaign)
		if !o.res.Claimed {
			continue
		}
		v := o.res.Code
		if o.campaign != "codes" {
			require.Empty(t, v)
			require.Positive(t, o.res.Seq)
			v = fmt.Sprint(o.res.Seq)
		} else {
			require.Zero(t, o.res.Seq)
			require.NotEmpty(t, v)
		}
		if held[o.campaign] == nil {
			held[o.campaign] = map[string]string{}
		}
		if prev, ok := held[o.campaign][o.member]; ok {
			require.Equal(t, prev, v, "a member's repeated claims return one voucher")
		}
		held[o.campaign][o.member] = v
	}
	for campaign, total := range totals {
		require.Len(t, held[campaign], int(total), campaign)
		distinct := map[string]bool{}
		for _, v := range held[campaign] {
			distinct[v] = true
		}
		require.Len(t, distinct, int(total), "%s: each voucher handed out once", campaign)
		st, err := voucherOf(t, b.client).Campaign(b.ctx, campaign)
		require.NoError(t, err)
		require.Equal(t, total, st.Claimed, campaign)
		require.True(t, st.SoldOut, campaign)
		var claimRows int64
		require.NoError(t, b.pool.QueryRow(b.ctx,
			`SELECT count(*) FROM pgquota.voucher_claim WHERE campaign = $1`, campaign).Scan(&claimRows))
		if campaign != "codes" {
			require.Equal(t, total, claimRows, campaign)
		}
	}
	var ledger int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.ledger WHERE operation = 'claim'`).Scan(&ledger))
	require.Equal(t, int64(3*members), ledger, "one ledger row per keyed claim")
}

// A fresh client's first ClaimTx on a code campaign tries the pool
// statement first; that statement writes nothing and raises nothing, so the
// caller's transaction goes on and its code claim commits with it.
func TestClaimTxFirstClaimOfCodeCampaignKeepsTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{"ONLY"})
	require.NoError(t, err)
	fresh, err := quota.New(b.pool, testConfig(t, nil))
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	res, err := voucherOf(t, fresh).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "codes", Member: "alice"})
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Equal(t, "ONLY", res.Code)
	var one int
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT 1`).Scan(&one), "the transaction is not aborted")
	require.NoError(t, tx.Commit(b.ctx))
	var member string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT member FROM pgquota.voucher_code WHERE code = 'ONLY'`).Scan(&member))
	require.Equal(t, "alice", member)
}
