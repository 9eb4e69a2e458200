// Package voucher hands out vouchers: a campaign of N units or of imported
// codes, each member claiming at most one, the total never exceeded under
// any concurrency (the check is the WHERE clause of the statement that
// claims: a conditional update; PostgreSQL manual, section 13.2.1, Read
// Committed Isolation Level).
//
// Three kinds of campaign, one Claim for all:
//
//   - a counted pool (CreateCampaign): units numbered 1 to total;
//   - a sharded pool (CreateShardedCampaign): the total split across shard
//     rows, so many claims proceed at once;
//   - a code campaign (ImportCodes): pre-loaded distinct codes.
//
// Usage:
//
//	q, _ := quota.New(pool, nil)
//	vouchers, _ := voucher.New(q, nil)
//	_, _ = vouchers.CreateCampaign(ctx, "launch", 100) // operator work
//	res, err := vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: "launch", Member: userID})
//	switch {
//	case err != nil: // *quota.InputError, voucher.ErrCampaignNotFound, quota.ErrOutcomeUnknown, ...
//	case !res.Claimed: // sold out
//	default: // res.Seq is the member's unit; a repeat (res.Repeat) returns the first claim
//	}
//
// Creating campaigns and importing codes is operator work
// (migrations.OperatorRole); claiming is the application's.
package voucher
