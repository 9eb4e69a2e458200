package quota

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/dbutil"
)

// BatchOutcome is the outcome of one request of GrantBatch: its result, or
// the error that kept it from being decided. A denial is a result (Granted
// false), not an error.
type BatchOutcome struct {
	// GrantResult is the request's outcome when Err is nil.
	GrantResult
	// Err is *InputError (ErrInvalidInput) for a bad request,
	// ErrQuotaNotFound, ErrNoLimit, ErrIdempotencyKeyReused, or
	// ErrBatchContended; nil otherwise. Nothing was granted for a request
	// with an error.
	Err error `json:"-"`

	// window is the counter's window as the database reported it
	// (infinite bounds included), for the ledger's outcome rows.
	windowStart, windowEnd pgtype.Timestamptz
}

// maxBatchRounds bounds the statements a batch runs for requests whose
// counter changed under it. Each round re-runs only those requests, and
// the next round's snapshot sees the change, so one extra round is the rule.
const maxBatchRounds = 10

// GrantBatch grants many requests in ONE SQL statement (one round trip and,
// outside a transaction, one commit). Requests on the same counter (quota
// and member) are decided one after another in slice order, as if each had
// been a Grant run in that order: request i is granted when the counter,
// plus the units granted to earlier requests of the batch, plus its amount
// stays at or below its limit, and each gets its own Used. Requests on
// different counters are independent. The limit holds under any
// concurrency, as for Grant: the statement locks each counter with room,
// re-read at its newest version, and writes it from that value (see
// queries/usage_batch.sql; the PostgreSQL manual, section 13.2.1).
//
// The outcomes are in request order, one per request. A bad request (an
// *InputError), an undefined quota (ErrQuotaNotFound) or a request with no
// limit (ErrNoLimit) is reported in its outcome and does not stop the
// others. In the rare case that a counter was created or filled by another
// transaction after the statement's snapshot was taken, its requests are
// decided by a second statement (and the call is not one commit).
//
// Counters are locked in key order, so concurrent batches do not deadlock
// on each other; a batch waits for a counter locked by another
// transaction. The batch statement carries arrays: a few thousand requests
// per call keep its locks and its reply short.
//
// A serialization failure or deadlock of the batch statement (possible
// when the database's default_transaction_isolation is REPEATABLE READ or
// SERIALIZABLE) rolled it back as a whole; it is run again, with backoff,
// for up to Config.RetryMaxElapsed (see IsRetryable).
//
// Requests may carry idempotency keys (GrantRequest.Idempotency). A batch
// with keys runs in one transaction: the keys are recorded in the grant
// ledger first (in key order, so keyed statements cannot deadlock), the
// requests whose key was recorded are granted together with the unkeyed
// ones, and each recorded request's outcome is stored under its own grant
// id (Keyed.GrantID), so that ledger rows, grants and outcomes commit
// together (see queries/ledger_batch.sql). A request whose key was used
// before, or by an earlier request of the batch, replays that outcome
// (Keyed.Replayed), or fails with ErrIdempotencyKeyReused when it is
// another request. Such a batch takes four statements instead of one.
//
// Errors (for the whole batch, with nil outcomes): the context's error;
// ErrSchemaMissing; database errors (SQLSTATE kept). Nothing was granted
// then, except when ctx ended while a statement ran: as for Grant, the
// outcome of that statement is then unknown.
func (c *Client) GrantBatch(ctx context.Context, reqs []GrantRequest) ([]BatchOutcome, error) {
	return c.grantBatchOwn(ctx, reqs)
}

// grantBatchOwn is GrantBatch: without keys, one statement on the pool
// (retried by grantBatchRound); with keys, one transaction, run again from
// the start after a serialization failure or deadlock.
func (c *Client) grantBatchOwn(ctx context.Context, reqs []GrantRequest) ([]BatchOutcome, error) {
	if !anyKeyed(reqs) {
		return c.grantBatch(ctx, ownTx{c.pool}, reqs)
	}
	for run := 1; ; run++ {
		outs, err := retry(ctx, c.policy, func() ([]BatchOutcome, error) {
			return dbutil.WithTxResult(ctx, c.pool, func(tx pgx.Tx) ([]BatchOutcome, error) {
				return c.grantBatch(ctx, tx, reqs)
			})
		})
		if !errors.Is(err, errKeyedUndecided) || run == maxBatchRounds {
			return outs, err
		}
	}
}

// GrantBatchTx is GrantBatch inside the caller's transaction: every grant
// of the batch commits or rolls back with tx. The counters stay locked
// until tx ends. In REPEATABLE READ or SERIALIZABLE transactions a counter
// changed by a concurrent transaction fails the statement with SQLSTATE
// 40001, returned unchanged: the caller retries its whole transaction.
// With keyed requests the batch writes ledger rows before it grants: when
// it returns an error, roll tx back.
func (c *Client) GrantBatchTx(ctx context.Context, tx pgx.Tx, reqs []GrantRequest) ([]BatchOutcome, error) {
	return c.grantBatch(ctx, tx, reqs)
}

// counterKey names a counter of the batch statement.
type counterKey struct{ quota, member string }

// batchCounter is what the batch statement reported for one counter.
type batchCounter struct {
	row           db.UsageGrantBatchRow // the 'counter' row
	written       bool                  // an 'updated' or 'inserted' row came back
	before, after int64                 // the counter before and after the write
	implicit      *int64                // the limit of requests that give none
	reqs          []int                 // indexes of its requests, in order
	hasCounter    bool
}

func (c *Client) grantBatch(ctx context.Context, x db.DBTX, reqs []GrantRequest) ([]BatchOutcome, error) {
	out := make([]BatchOutcome, len(reqs))
	todo := make([]int, 0, len(reqs))
	keyed := false
	for i, req := range reqs {
		out[i].Quota, out[i].Member, out[i].Amount = req.Quota, req.Member, req.Amount
		if err := checkGrantRequest(req); err != nil {
			out[i].Err = err
			continue
		}
		keyed = keyed || req.Idempotency.Key != ""
		todo = append(todo, i)
	}
	if !keyed {
		return out, c.grantBatchRounds(ctx, x, reqs, todo, out)
	}
	return out, c.grantBatchKeyed(ctx, x, reqs, todo, out)
}

// grantBatchRounds runs the batch statement for the requests todo until
// every one is decided, for up to maxBatchRounds statements.
func (c *Client) grantBatchRounds(ctx context.Context, x db.DBTX, reqs []GrantRequest, todo []int, out []BatchOutcome) error {
	for round := 0; len(todo) > 0; round++ {
		if round == maxBatchRounds {
			for _, i := range todo {
				out[i].Err = fmt.Errorf("%w (quota %q, member %q)", ErrBatchContended, reqs[i].Quota, reqs[i].Member)
			}
			break
		}
		again, err := c.grantBatchRound(ctx, x, reqs, todo, out)
		if err != nil {
			return err
		}
		todo = again
	}
	return nil
}

// checkGrantRequest validates a grant request as Grant does.
func checkGrantRequest(req GrantRequest) error {
	if err := checkName("quota name", req.Quota); err != nil {
		return err
	}
	if err := checkName("member", req.Member); err != nil {
		return err
	}
	if err := checkUnits("amount", req.Amount, 1); err != nil {
		return err
	}
	if req.Limit != nil {
		if err := checkUnits("limit", *req.Limit, 0); err != nil {
			return err
		}
	}
	if req.Idempotency.Key != "" {
		if _, err := checkKey(req.Idempotency, req.Quota); err != nil {
			return err
		}
	}
	return nil
}

// grantBatchRound runs the batch statement for the requests todo (indexes
// into reqs, in order), fills their outcomes, and returns the requests to
// run again because their counter changed under the statement.
func (c *Client) grantBatchRound(ctx context.Context, x db.DBTX, reqs []GrantRequest, todo []int, out []BatchOutcome) ([]int, error) {
	counters := make(map[counterKey]*batchCounter)
	var order []*batchCounter
	for _, i := range todo {
		k := counterKey{reqs[i].Quota, reqs[i].Member}
		bc := counters[k]
		if bc == nil {
			bc = &batchCounter{}
			counters[k] = bc
			order = append(order, bc)
		}
		bc.reqs = append(bc.reqs, i)
	}
	p := db.UsageGrantBatchParams{
		QuotaNames:  make([]string, 0, len(order)),
		Members:     make([]string, 0, len(order)),
		Firsts:      make([]int32, 0, len(order)),
		Counts:      make([]int32, 0, len(order)),
		Amounts:     make([]int64, 0, len(todo)),
		LimitValues: make([]int64, 0, len(todo)),
	}
	for _, bc := range order {
		first := reqs[bc.reqs[0]]
		p.QuotaNames = append(p.QuotaNames, first.Quota)
		p.Members = append(p.Members, first.Member)
		p.Firsts = append(p.Firsts, int32(len(p.Amounts)+1))
		p.Counts = append(p.Counts, int32(len(bc.reqs)))
		for _, i := range bc.reqs {
			limit := int64(-1)
			if reqs[i].Limit != nil {
				limit = *reqs[i].Limit
			}
			p.Amounts = append(p.Amounts, reqs[i].Amount)
			p.LimitValues = append(p.LimitValues, limit)
		}
	}
	run := func() ([]db.UsageGrantBatchRow, error) { return c.queries.UsageGrantBatch(ctx, x, p) }
	var rows []db.UsageGrantBatchRow
	var err error
	if _, own := x.(ownTx); own {
		// The statement is its own transaction: after a serialization
		// failure or deadlock (possible when the database's default
		// isolation is REPEATABLE READ or SERIALIZABLE) it rolled back as a
		// whole and runs again.
		rows, err = retry(ctx, c.policy, run)
	} else {
		rows, err = run()
	}
	if err != nil {
		return nil, dbError("grant batch", err)
	}
	for _, r := range rows {
		bc := counters[counterKey{r.QuotaName, r.Member}]
		if bc == nil {
			return nil, fmt.Errorf("pgquota: grant batch: the database reported a counter (%q, %q) that was not asked for", r.QuotaName, r.Member)
		}
		switch r.Kind {
		case "counter":
			bc.row, bc.hasCounter = r, true
			if r.HasImplicitLimit {
				bc.implicit = &r.ImplicitLimit
			}
		case "updated":
			bc.written, bc.before, bc.after = true, r.UsedBefore, r.UsedAfter
		case "inserted":
			bc.written, bc.before, bc.after = true, 0, r.UsedAfter
		default:
			return nil, fmt.Errorf("pgquota: grant batch: unknown row kind %q", r.Kind)
		}
	}
	var again []int
	for _, bc := range order {
		if !bc.hasCounter {
			for _, i := range bc.reqs {
				out[i].Err = fmt.Errorf("%w: %q", ErrQuotaNotFound, reqs[i].Quota)
			}
			continue
		}
		limits := make([]*int64, len(bc.reqs))
		for j, i := range bc.reqs {
			limits[j] = reqs[i].Limit
			if limits[j] == nil {
				limits[j] = bc.implicit
			}
		}
		switch {
		case bc.written:
			used := bc.before
			for j, i := range bc.reqs {
				granted := false
				if limits[j] != nil {
					granted, used = take(used, reqs[i].Amount, *limits[j])
				}
				out[i].GrantResult = batchResult(reqs[i], bc.row, limits[j], granted, used)
				out[i].windowStart, out[i].windowEnd = bc.row.WindowStart, bc.row.WindowEnd
			}
			if used != bc.after {
				return nil, fmt.Errorf("pgquota: grant batch: counter (%q, %q) went from %d to %d, the requests replay to %d",
					bc.row.QuotaName, bc.row.Member, bc.before, bc.after, used)
			}
		case greedy(bc.row.SnapshotUsed, bc.reqs, reqs, limits) > 0:
			// The snapshot had room but nothing was written: a concurrent
			// transaction created or changed the counter meanwhile.
			for j, i := range bc.reqs {
				if limits[j] != nil {
					again = append(again, i)
				}
			}
		default:
			for j, i := range bc.reqs {
				out[i].GrantResult = batchResult(reqs[i], bc.row, limits[j], false, bc.row.UsedAfter)
				out[i].windowStart, out[i].windowEnd = bc.row.WindowStart, bc.row.WindowEnd
			}
		}
		for j, i := range bc.reqs {
			if limits[j] == nil {
				out[i].GrantResult = GrantResult{Quota: reqs[i].Quota, Member: reqs[i].Member, Amount: reqs[i].Amount}
				out[i].Err = fmt.Errorf("%w (quota %q, member %q)", ErrNoLimit, reqs[i].Quota, reqs[i].Member)
			}
		}
	}
	return again, nil
}

// take decides one request on a counter at used, as pgquota.greedy_take
// does: granted when used + amount <= limit (written so that it cannot
// overflow), and the counter after it.
func take(used, amount, limit int64) (granted bool, after int64) {
	if amount <= limit-used {
		return true, used + amount
	}
	return false, used
}

// greedy returns the units pgquota.greedy_take grants to the requests idx
// (with their limits) on a counter at used.
func greedy(used int64, idx []int, reqs []GrantRequest, limits []*int64) int64 {
	start := used
	for j, i := range idx {
		if limits[j] != nil {
			_, used = take(used, reqs[i].Amount, *limits[j])
		}
	}
	return used - start
}

// batchResult is the GrantResult of one request of a batch.
func batchResult(req GrantRequest, r db.UsageGrantBatchRow, limit *int64, granted bool, used int64) GrantResult {
	res := GrantResult{
		Granted:     granted,
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Used:        used,
		WindowStart: timeFromPG(r.WindowStart),
		WindowEnd:   timeFromPG(r.WindowEnd),
	}
	if limit != nil {
		res.Limit = *limit
		res.Remaining = max(*limit-used, 0)
	}
	return res
}

// ownTx marks an executor whose statements each run in their own implicit
// transaction (the pool): pgquota owns those transactions and may run a
// statement again after a serialization failure or deadlock.
type ownTx struct{ db.DBTX }
