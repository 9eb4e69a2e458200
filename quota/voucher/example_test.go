package voucher_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pgquota/pgquota/internal/testbundle"
	"github.com/pgquota/pgquota/quota/voucher"
)

// Claim a voucher: one call for every kind of campaign; a repeated claim
// returns the member's first voucher, and a sold-out campaign is a result.
func ExampleClient_Claim() {
	ctx := context.Background()
	client, _, done := testbundle.ExampleClient(ctx)
	defer done()
	vouchers, err := voucher.New(client, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := vouchers.CreateCampaign(ctx, "black-friday", 1); err != nil {
		log.Fatal(err)
	}
	for _, member := range []string{"alice", "alice", "bob"} {
		res, err := vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: "black-friday", Member: member})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: claimed=%t repeat=%t seq=%d\n", member, res.Claimed, res.Repeat, res.Seq)
	}
	// Output:
	// alice: claimed=true repeat=false seq=1
	// alice: claimed=true repeat=true seq=1
	// bob: claimed=false repeat=false seq=0
}
