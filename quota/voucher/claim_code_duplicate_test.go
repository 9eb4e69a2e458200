package voucher_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// Copies of one member's claim (a double-click, a retried request) race
// for a campaign's last code. The copy that takes it commits while the
// others look: each of them must find the member's code, never report the
// campaign sold out.
func TestClaimCodeDuplicatesForLastCode(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprint("keyed ", keyed), func(t *testing.T) {
			t.Parallel()
			const copies = 64
			rounds := 100
			if keyed {
				rounds = 40 // each copy also records a ledger row
			}
			b := setup(t, 16)
			wrong := 0
			for round := range rounds {
				campaign := fmt.Sprint("c", round)
				// Another member holds every code but the last one.
				codes := []string{fmt.Sprint("a-", round), fmt.Sprint("b-", round)}
				_, err := voucherOf(t, b.operator).ImportCodes(b.ctx, campaign, codes)
				require.NoError(t, err)
				first, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: campaign, Member: "other"})
				require.NoError(t, err)
				require.True(t, first.Claimed)
				code := codes[0]
				if first.Code == code {
					code = codes[1]
				}

				var mu sync.Mutex
				var claims []voucher.ClaimResult
				var errs []error
				concurrently(copies, func(i int) {
					var c voucher.ClaimResult
					var err error
					if keyed {
						c, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: campaign, Member: "m", Idempotency: quota.IdempotencyKey{Key: fmt.Sprint("k", i)}})
					} else {
						c, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: campaign, Member: "m"})
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					claims = append(claims, c)
				})
				require.Empty(t, errs, "round %d", round)
				fresh := 0
				bad := 0
				for _, c := range claims {
					if !c.Claimed || c.Code != code {
						bad++
						continue
					}
					if !c.Repeat {
						fresh++
					}
				}
				if bad > 0 {
					wrong++
					t.Errorf("round %d: %d of %d copies were not given the member's code %q", round, bad, copies, code)
					continue
				}
				require.Equal(t, 1, fresh, "round %d: one copy claimed, the others repeat it", round)
			}
			require.Zero(t, wrong, "rounds with a wrong answer, of %d", rounds)
		})
	}
}
