package quota

import (
	"context"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
)

// The requests of a batch (GrantBatch, a coalesced or grouped statement)
// that pgquota.grant_limits decides: a quota of kind rate, fixed or
// rolling, a grant against several quotas (GrantRequest.Quotas), and a
// calendar request whose counter such a grant of the same batch names.
// They take one statement, pgquota.grant_limits_batch (migrations/00016),
// which calls pgquota.grant_limits for each in request order after locking
// their state rows in key order: each gets exactly the outcome Grant would
// give it, had the requests run one after another in that order.

// limitsBatch is the part of a batch that pgquota.grant_limits_batch
// decides: indexes into the batch's requests, in order, and the quotas each
// names.
type limitsBatch struct {
	todo  []int
	names [][]string
}

// grantLimitsBatch runs pgquota.grant_limits_batch for the requests of lb
// (validated by checkGrantRequest) and fills their outcomes: a result, or
// the request's own error (ErrQuotaNotFound, ErrNoLimit, *InputError for a
// rolling limit above MaxRollingLimit). On the pool (ownTx) a serialization
// failure or deadlock is retried; in a transaction it is returned.
func (c *Client) grantLimitsBatch(ctx context.Context, x db.DBTX, reqs []GrantRequest, lb limitsBatch, out []BatchOutcome) error {
	if len(lb.todo) == 0 {
		return nil
	}
	p := db.LimitsGrantBatchParams{
		QuotaNames:  make([]string, 0, len(lb.todo)),
		Firsts:      make([]int32, 0, len(lb.todo)),
		Counts:      make([]int32, 0, len(lb.todo)),
		Members:     make([]string, 0, len(lb.todo)),
		Amounts:     make([]int64, 0, len(lb.todo)),
		LimitValues: make([]int64, 0, len(lb.todo)),
	}
	for k, i := range lb.todo {
		limit := int64(-1)
		if reqs[i].Limit != nil {
			limit = *reqs[i].Limit
		}
		p.Firsts = append(p.Firsts, int32(len(p.QuotaNames)+1))
		p.Counts = append(p.Counts, int32(len(lb.names[k])))
		p.QuotaNames = append(p.QuotaNames, lb.names[k]...)
		p.Members = append(p.Members, reqs[i].Member)
		p.Amounts = append(p.Amounts, reqs[i].Amount)
		p.LimitValues = append(p.LimitValues, limit)
	}
	run := func() ([]db.LimitsGrantBatchRow, error) { return c.queries.LimitsGrantBatch(ctx, x, p) }
	var rows []db.LimitsGrantBatchRow
	var err error
	if _, own := x.(ownTx); own {
		rows, err = core.Retry(ctx, c.policy, run)
	} else {
		rows, err = run()
	}
	if err != nil {
		return core.DBError("grant batch", err)
	}
	per := make([][]db.LimitsGrantRow, len(lb.todo))
	for _, r := range rows {
		k := int(r.ReqIndex) - 1
		if k < 0 || k >= len(lb.todo) {
			return core.Errorf("pgquota: grant batch: the database reported request %d of %d", r.ReqIndex, len(lb.todo))
		}
		per[k] = append(per[k], db.LimitsGrantRow{
			Ord: r.Ord, QuotaName: r.QuotaName, Kind: r.Kind, Found: r.Found, Decided: r.Decided,
			HasLimit: r.HasLimit, LimitValue: r.LimitValue, Burst: r.Burst, PeriodUs: r.PeriodUs,
			Fits: r.Fits, Granted: r.Granted, Used: r.Used, Remaining: r.Remaining,
			WindowStart: r.WindowStart, WindowEnd: r.WindowEnd,
			RetryAfterUs: r.RetryAfterUs, ResetAfterUs: r.ResetAfterUs, DecidedAt: r.DecidedAt,
		})
	}
	for k, i := range lb.todo {
		res, err := c.limitsOutcome(reqs[i], lb.names[k], per[k])
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].GrantResult, out[i].Err = res, nil
	}
	return nil
}
