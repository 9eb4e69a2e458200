package quota

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/dbutil"
	"github.com/pgquota/pgquota/internal/errtext"
)

// BatchOutcome is the outcome of one request of GrantBatch: its result, or
// the error that kept it from being decided. A denial is a result (Granted
// false), not an error.
type BatchOutcome struct {
	// GrantResult is the request's outcome when Err is nil.
	GrantResult
	// Err is *InputError (ErrInvalidInput) for a bad request (among
	// them an idempotency key on a request with Quotas or for a quota of
	// kind rate, fixed or rolling, which record no keys, and a rolling
	// limit above MaxRollingLimit), ErrQuotaNotFound, ErrNoLimit, or
	// ErrIdempotencyKeyReused; nil otherwise. Nothing was granted for a
	// request with an error.
	Err error `json:"-"`

	// window is the counter's window as the database reported it
	// (infinite bounds included), for the ledger's outcome rows.
	windowStart, windowEnd pgtype.Timestamptz
}

// maxKeyedRuns bounds the runs of a keyed batch whose limit or quota
// changed between its statements (errKeyedUndecided): each run sees the
// change before it records its keys, so one extra run is the rule.
const maxKeyedRuns = 10

// GrantBatch grants many requests in ONE SQL statement (one round trip and,
// outside a transaction, one commit). Requests on the same counter (quota
// and member) are decided one after another in slice order, as if each had
// been a Grant run in that order: request i is granted when the counter,
// plus the units granted to earlier requests of the batch, plus its amount
// stays at or below its limit, and each gets its own Used. Requests on
// different counters are independent. The limit holds under any
// concurrency, as for Grant: the statement locks each counter with room,
// re-read at its newest version, and writes it from that value (see
// pgquota.usage_grant_batch in migrations/00009_grant_batch.sql; the
// PostgreSQL manual, section 13.2.1). So any number of batches, coalesced
// calls and single grants, from any number of Clients and processes, may
// share counters: every request gets a granted or denied answer, the one
// it would have got had the requests run one after another in some order.
//
// The outcomes are in request order, one per request. A bad request (an
// *InputError), an undefined quota (ErrQuotaNotFound) or a request with no
// limit (ErrNoLimit) is reported in its outcome and does not stop the
// others.
//
// Counters are locked in key order, so concurrent batches do not deadlock
// on each other's counters (but see below); a batch waits for a counter
// locked by another transaction. The batch statement carries arrays: a few
// thousand requests per call keep its locks and its reply short.
//
// A serialization failure or deadlock of the batch statement (possible
// when the database's default_transaction_isolation is REPEATABLE READ or
// SERIALIZABLE, or when batches race to create the same counters) rolled
// it back as a whole; it is run again, with backoff, for up to
// Config.RetryMaxElapsed (see IsRetryable).
//
// Requests of every kind are served. Requests for a quota of kind rate,
// fixed or rolling, grants against several quotas (GrantRequest.Quotas),
// and unkeyed calendar requests whose counter such a grant of the batch
// names, are decided by a second statement, pgquota.grant_limits_batch
// (migrations/00016_shaped_batch.sql): one after another in slice order,
// each exactly as Grant would decide it alone at that point (its own
// DecidedAt, RetryAfter, ResetAfter, DeniedBy and Limits), after the
// statement locked their state rows in key order. A batch with requests for
// both statements runs them in one transaction (one commit; retried as a
// whole after a serialization failure or deadlock). Lock waits between
// the two statements of concurrent mixed batches can form a cycle: the
// deadlock (40P01) rolls one back, and it is retried. A keyed calendar
// request whose counter a grant against several quotas of the same batch
// names is decided after it, whatever their order in the slice. The
// calendar requests' outcomes carry DecidedAt (the batch statement's
// instant), and RetryAfter and ResetAfter as pgquota.grant_limits computes
// them for a calendar quota (0 when granted; the time to the window's end;
// Never for an amount above the limit, or a lifetime counter).
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
// then, except after ErrOutcomeUnknown: the batch statement (without keys)
// or the COMMIT of its transaction (with keys, or with requests for both
// statements) was sent and no reply said how it ended, so the whole batch
// may have been granted. Repeat a keyed
// batch with the same keys to learn each outcome; an unkeyed repeat may
// grant twice (read the counters with Usage instead).
func (c *Client) GrantBatch(ctx context.Context, reqs []GrantRequest) (outs []BatchOutcome, err error) {
	defer c.batchDone(ctx, core.OpGrantBatch, c.m.Now(), reqs, &outs, &err)
	return c.grantBatchOwn(ctx, reqs, 0)
}

// grantBatchOwn is GrantBatch: without keys, one statement on the pool
// (its own implicit transaction), else one transaction. With lockWait set
// (group commit), every statement of the batch waits at most lockWait for
// a lock another transaction holds: the batch then fails as a whole with
// SQLSTATE 55P03 (core.IsLockWaitBounded) and wrote nothing.
func (c *Client) grantBatchOwn(ctx context.Context, reqs []GrantRequest, lockWait time.Duration) ([]BatchOutcome, error) {
	own := ownTx{DBTX: c.db.Pool, lockWait: lockWait}
	if lockWait > 0 {
		p := c.db.Pool
		p.LockWait = lockWait
		own.DBTX = p
	}
	if !anyKeyed(reqs) {
		return c.grantBatch(ctx, own, reqs)
	}
	for run := 1; ; run++ {
		outs, err := core.Retry(ctx, c.policy, func() ([]BatchOutcome, error) {
			return dbutil.WithTxResult(ctx, c.pool, func(tx pgx.Tx) ([]BatchOutcome, error) {
				if err := boundLockWait(ctx, tx, lockWait); err != nil {
					return nil, err
				}
				return c.grantBatch(ctx, tx, reqs)
			})
		})
		if !errors.Is(err, errKeyedUndecided) || run == maxKeyedRuns {
			return outs, batchError(err)
		}
	}
}

// boundLockWait sets lock_timeout to lockWait for the rest of tx, when
// lockWait is set.
func boundLockWait(ctx context.Context, tx pgx.Tx, lockWait time.Duration) error {
	if lockWait <= 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", core.LockTimeoutSetting(lockWait)); err != nil {
		return core.DBError("grant batch", err)
	}
	return nil
}

// batchError is the error of a batch's own transaction: the errors of
// BEGIN and COMMIT (dbutil.WithTx; a lost COMMIT is already marked
// ErrOutcomeUnknown, a failed BEGIN wrote nothing) get the "pgquota: grant
// batch: " prefix its statements' errors have.
func batchError(err error) error {
	if err == nil || strings.HasPrefix(err.Error(), errtext.Prefix) {
		return err
	}
	return core.DBError("grant batch", err)
}

// GrantBatchTx is GrantBatch inside the caller's transaction: every grant
// of the batch commits or rolls back with tx. The counters stay locked
// until tx ends. In REPEATABLE READ or SERIALIZABLE transactions a counter
// changed by a concurrent transaction fails the statement with SQLSTATE
// 40001, returned unchanged: the caller retries its whole transaction.
// With keyed requests the batch writes ledger rows before it grants: when
// it returns an error, roll tx back.
func (c *Client) GrantBatchTx(ctx context.Context, tx pgx.Tx, reqs []GrantRequest) (outs []BatchOutcome, err error) {
	defer c.batchDone(ctx, core.OpGrantBatchTx, c.m.Now(), reqs, &outs, &err)
	return c.grantBatch(ctx, tx, reqs)
}

// batchCounter is one counter of the batch statement: its requests, and
// what the statement reported for it.
type batchCounter struct {
	row   db.UsageGrantBatchRow
	found bool  // a row came back: the quota exists
	reqs  []int // indexes of its requests, in order
}

func (c *Client) grantBatch(ctx context.Context, x db.DBTX, reqs []GrantRequest) ([]BatchOutcome, error) {
	out := make([]BatchOutcome, len(reqs))
	// names[i] is set for the requests pgquota.grant_limits decides.
	names := make([][]string, len(reqs))
	valid := make([]bool, len(reqs))
	multi := make(map[groupCounter]bool) // the counters grants against several quotas name
	for i, req := range reqs {
		out[i].Quota, out[i].Member, out[i].Amount = req.Quota, req.Member, req.Amount
		shaped, err := c.shapedRouteErr(ctx, core.ReadsOf(x), req)
		if err != nil {
			// A database error (a privilege the role lacks, a lost
			// connection): in a transaction it aborted it, and the
			// batch's statements would fail with 25P02 instead.
			return nil, err
		}
		n, err := checkGrantRequest(req, shaped)
		if err != nil {
			out[i].Err = err
			continue
		}
		valid[i] = true
		if shaped {
			names[i] = n
			if len(req.Quotas) > 0 {
				for _, q := range n {
					multi[groupCounter{q, req.Member}] = true
				}
			}
		}
	}
	var lb limitsBatch
	todo := make([]int, 0, len(reqs))
	keyed := false
	for i, req := range reqs {
		switch {
		case !valid[i]:
		case names[i] == nil && req.Idempotency.Key == "" && multi[groupCounter{req.Quota, req.Member}]:
			// A calendar counter that a grant against several quotas of
			// the batch names: decided in the same statement, in order.
			lb.todo, lb.names = append(lb.todo, i), append(lb.names, []string{req.Quota})
		case names[i] != nil:
			lb.todo, lb.names = append(lb.todo, i), append(lb.names, names[i])
		default:
			keyed = keyed || req.Idempotency.Key != ""
			todo = append(todo, i)
		}
	}
	if own, isOwn := x.(ownTx); isOwn && len(todo) > 0 && len(lb.todo) > 0 {
		// Two statements: one transaction, so that the batch commits (or
		// fails) as a whole, run again after a serialization failure.
		_, err := core.Retry(ctx, c.policy, func() (struct{}, error) {
			return dbutil.WithTxResult(ctx, c.pool, func(tx pgx.Tx) (struct{}, error) {
				if err := boundLockWait(ctx, tx, own.lockWait); err != nil {
					return struct{}{}, err
				}
				if err := c.grantLimitsBatch(ctx, tx, reqs, lb, out); err != nil {
					return struct{}{}, err
				}
				return struct{}{}, c.grantBatchDecide(ctx, tx, reqs, todo, out)
			})
		})
		return out, batchError(err)
	}
	if err := c.grantLimitsBatch(ctx, x, reqs, lb, out); err != nil {
		return out, err
	}
	if !keyed {
		return out, c.grantBatchDecide(ctx, x, reqs, todo, out)
	}
	return out, c.grantBatchKeyed(ctx, x, reqs, todo, out)
}

// grantBatchDecide runs the batch statement for the requests todo
// (indexes into reqs, in order) and fills their outcomes.
func (c *Client) grantBatchDecide(ctx context.Context, x db.DBTX, reqs []GrantRequest, todo []int, out []BatchOutcome) error {
	if len(todo) == 0 {
		return nil
	}
	return c.grantBatchStatement(ctx, x, reqs, todo, out, nil)
}

// grantBatchStatement runs the batch statement for the requests todo
// (indexes into reqs, in order) and fills their outcomes. The statement
// decides every counter it is given (see pgquota.usage_grant_batch): it
// reports, per counter, the value it wrote from (or the fresh value of a
// counter no request fitted), and each request's outcome is replayed from
// there. grantIDs, when not nil, holds the ledger grant ids of the keyed
// requests of todo recorded now (LedgerBatchInsert): the statement is then
// UsageGrantBatchKeyed, which stores their outcomes as it decided them.
func (c *Client) grantBatchStatement(ctx context.Context, x db.DBTX, reqs []GrantRequest, todo []int, out []BatchOutcome, grantIDs map[int]int64) error {
	type counterKey struct{ quota, member string }
	index := make(map[counterKey]int)
	var order []*batchCounter
	for _, i := range todo {
		k := counterKey{reqs[i].Quota, reqs[i].Member}
		n, ok := index[k]
		if !ok {
			n = len(order)
			index[k] = n
			order = append(order, &batchCounter{})
		}
		order[n].reqs = append(order[n].reqs, i)
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
	if grantIDs != nil {
		kp := db.UsageGrantBatchKeyedParams{
			QuotaNames: p.QuotaNames, Members: p.Members, Firsts: p.Firsts, Counts: p.Counts,
			Amounts: p.Amounts, LimitValues: p.LimitValues, GrantIds: make([]int64, 0, len(todo)),
		}
		for _, bc := range order {
			for _, i := range bc.reqs {
				kp.GrantIds = append(kp.GrantIds, grantIDs[i]) // 0: no key recorded now
			}
		}
		run = func() ([]db.UsageGrantBatchRow, error) {
			krows, err := c.queries.UsageGrantBatchKeyed(ctx, x, kp)
			rows := make([]db.UsageGrantBatchRow, len(krows))
			for n, r := range krows {
				rows[n] = db.UsageGrantBatchRow(r)
			}
			return rows, err
		}
	}
	var rows []db.UsageGrantBatchRow
	var err error
	if _, own := x.(ownTx); own {
		// The statement is its own transaction: after a serialization
		// failure or deadlock (possible when the database's default
		// isolation is REPEATABLE READ or SERIALIZABLE) it rolled back as a
		// whole and runs again.
		rows, err = core.Retry(ctx, c.policy, run)
	} else {
		rows, err = run()
	}
	if err != nil {
		return core.DBError("grant batch", err)
	}
	for _, r := range rows {
		n := int(r.CounterIndex) - 1
		if n < 0 || n >= len(order) || order[n].found {
			return core.Errorf("pgquota: grant batch: the database reported counter %d of %d twice or out of range", r.CounterIndex, len(order))
		}
		order[n].row, order[n].found = r, true
	}
	for _, bc := range order {
		if !bc.found {
			for _, i := range bc.reqs {
				out[i].Err = core.Errorf("%w: %q", ErrQuotaNotFound, reqs[i].Quota)
			}
			continue
		}
		var implicit *int64
		if bc.row.HasImplicitLimit {
			implicit = &bc.row.ImplicitLimit
		}
		used := bc.row.UsedBefore
		for _, i := range bc.reqs {
			limit := reqs[i].Limit
			if limit == nil {
				limit = implicit
			}
			if limit == nil {
				out[i].GrantResult = GrantResult{Quota: reqs[i].Quota, Member: reqs[i].Member, Amount: reqs[i].Amount}
				out[i].Err = core.Errorf("%w (quota %q, member %q)", ErrNoLimit, reqs[i].Quota, reqs[i].Member)
				continue
			}
			granted := false
			if bc.row.Written {
				granted, used = take(used, reqs[i].Amount, *limit)
			}
			out[i].GrantResult = batchResult(reqs[i], bc.row, limit, granted, used)
			out[i].windowStart, out[i].windowEnd = bc.row.WindowStart, bc.row.WindowEnd
		}
		if used != bc.row.UsedAfter {
			return core.Errorf("pgquota: grant batch: counter (%q, %q) went from %d to %d, the requests replay to %d",
				reqs[bc.reqs[0]].Quota, reqs[bc.reqs[0]].Member, bc.row.UsedBefore, bc.row.UsedAfter, used)
		}
	}
	return nil
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

// batchResult is the GrantResult of one request of a batch.
func batchResult(req GrantRequest, r db.UsageGrantBatchRow, limit *int64, granted bool, used int64) GrantResult {
	res := GrantResult{
		Granted:     granted,
		Quota:       req.Quota,
		Member:      req.Member,
		Amount:      req.Amount,
		Used:        used,
		WindowStart: core.TimeFromPG(r.WindowStart),
		WindowEnd:   core.TimeFromPG(r.WindowEnd),
	}
	if limit != nil {
		res.Limit = *limit
		res.Remaining = max(*limit-used, 0)
		res.DecidedAt = core.TimeFromPG(r.DecidedAt)
		res.RetryAfter, res.ResetAfter = calendarWaits(granted, req.Amount, *limit, r.WindowEnd, r.DecidedAt)
	}
	return res
}

// ownTx marks an executor whose statements each run in their own implicit
// transaction (the pool): pgquota owns those transactions and may run a
// statement again after a serialization failure or deadlock.
type ownTx struct {
	db.DBTX
	// lockWait, when set, is the lock_timeout of the transactions a batch
	// opens itself (group commit); DBTX then bounds its statements too.
	lockWait time.Duration
}
