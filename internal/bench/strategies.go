package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquota/pgquota/internal/dbutil"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// The bench's quota and voucher campaign. The limit is far above what a
// run can use, so every operation does the full work of a grant: a run
// measures the cost of granting, never the cheaper denial.
const (
	benchQuota    = "bench"
	benchCampaign = "bench"
	hotMember     = "hot"
	// SpreadMembers is how many members the spread strategy grants to.
	SpreadMembers = 10000
	// uniqueMax is the top of the range new members are drawn from: two
	// draws of a run collide with negligible probability.
	uniqueMax = 1 << 62
	// advisoryKey is the advisory lock the advisory-lock strategy takes.
	advisoryKey int64 = 0x70677175_6f746131
)

var benchLimit = quota.MaxUnits

// resetUsage defines the bench quota (a day window in UTC) and replaces
// every usage counter by one counter at 0 per member in members, in the
// current window. It returns that window's bounds.
func resetUsage(ctx context.Context, env Env, members []string) (start, end time.Time, err error) {
	_, err = env.Client.DefineQuota(ctx, quota.Definition{Name: benchQuota, Window: quota.WindowDay, TimeZone: "UTC"})
	if err != nil {
		return start, end, err
	}
	if _, err = env.Pool.Exec(ctx, `TRUNCATE pgquota.usage`); err != nil {
		return start, end, fmt.Errorf("reset usage: %w", err)
	}
	err = env.Pool.QueryRow(ctx, `
		WITH w AS (
			SELECT pgquota.window_start('day', 'UTC', pgquota.clock()) AS s,
			       pgquota.window_end('day', 'UTC', pgquota.clock()) AS e
		), ins AS (
			INSERT INTO pgquota.usage (quota_name, member, window_start, window_end, used)
			SELECT $1, m, w.s, w.e, 0 FROM w, unnest($2::text[]) AS m
		)
		SELECT s, e FROM w`, benchQuota, members).Scan(&start, &end)
	if err != nil {
		return start, end, fmt.Errorf("seed usage: %w", err)
	}
	if _, err = env.Pool.Exec(ctx, `ANALYZE pgquota.usage`); err != nil {
		return start, end, fmt.Errorf("analyze usage: %w", err)
	}
	return start, end, nil
}

func grantOp(env Env, member func(vals []int64) string, vars ...Var) Op {
	limit := benchLimit
	return Op{
		Vars: vars,
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			res, err := env.Client.Grant(ctx, quota.GrantRequest{
				Quota: benchQuota, Member: member(vals), Amount: 1, Limit: &limit,
			})
			return Outcome{Granted: res.Granted}, err
		},
	}
}

// grantHot is pgquota's conditional grant, every call on one counter.
type grantHot struct{}

func (grantHot) Name() string { return "grant-hot" }
func (grantHot) Describe() string {
	return "pgquota Grant, one statement, every call on one hot counter row"
}
func (grantHot) Setup(ctx context.Context, env Env) (Op, error) {
	if _, _, err := resetUsage(ctx, env, []string{hotMember}); err != nil {
		return Op{}, err
	}
	return grantOp(env, func([]int64) string { return hotMember }), nil
}

// grantSpread is pgquota's conditional grant over SpreadMembers existing
// counters.
type grantSpread struct{}

func (grantSpread) Name() string { return "grant-spread" }
func (grantSpread) Describe() string {
	return fmt.Sprintf("pgquota Grant, one statement, spread over %d existing counter rows", SpreadMembers)
}
func (grantSpread) Setup(ctx context.Context, env Env) (Op, error) {
	members := make([]string, SpreadMembers)
	for i := range members {
		members[i] = strconv.Itoa(i + 1)
	}
	if _, _, err := resetUsage(ctx, env, members); err != nil {
		return Op{}, err
	}
	return grantOp(env, memberFromVar, Var{Name: "member", Min: 1, Max: SpreadMembers}), nil
}

// grantFirst is pgquota's conditional grant for a member without a
// counter yet: the upsert path.
type grantFirst struct{}

func (grantFirst) Name() string { return "grant-first" }
func (grantFirst) Describe() string {
	return "pgquota Grant, one statement, a new member every call (the upsert path)"
}
func (grantFirst) Setup(ctx context.Context, env Env) (Op, error) {
	if _, _, err := resetUsage(ctx, env, nil); err != nil {
		return Op{}, err
	}
	return grantOp(env, memberFromVar, Var{Name: "member", Min: 1, Max: uniqueMax}), nil
}

func memberFromVar(vals []int64) string { return strconv.FormatInt(vals[0], 10) }

// The hand-written strategies below work on the same hot counter row as
// grant-hot, with the window bounds the application computed once, and
// check the limit in Go between the read and the write. They are what an
// application does without a one-statement conditional grant.

const (
	sqlSelectForUpdate = `SELECT used FROM pgquota.usage WHERE quota_name = $1 AND member = $2 AND window_start = $3 AND window_end = $4 FOR UPDATE`
	sqlSelect          = `SELECT used FROM pgquota.usage WHERE quota_name = $1 AND member = $2 AND window_start = $3 AND window_end = $4`
	sqlIncrement       = `UPDATE pgquota.usage SET used = used + $5, updated_at = pgquota.clock() WHERE quota_name = $1 AND member = $2 AND window_start = $3 AND window_end = $4`
	sqlAdvisoryLock    = `SELECT pg_advisory_xact_lock($1::bigint)`
)

// readCheckWrite reads the hot counter with readSQL, checks the limit, and
// increments it: the body of the hand-written strategies.
func readCheckWrite(ctx context.Context, tx pgx.Tx, readSQL string, start, end time.Time) (bool, error) {
	var used int64
	if err := tx.QueryRow(ctx, readSQL, benchQuota, hotMember, start, end).Scan(&used); err != nil {
		return false, err
	}
	if used+1 > benchLimit {
		return false, nil
	}
	_, err := tx.Exec(ctx, sqlIncrement, benchQuota, hotMember, start, end, int64(1))
	return err == nil, err
}

// forUpdate locks the counter row with SELECT ... FOR UPDATE, checks, and
// updates it, in one transaction.
type forUpdate struct{}

func (forUpdate) Name() string { return "for-update" }
func (forUpdate) Describe() string {
	return "BEGIN; SELECT ... FOR UPDATE; check in Go; UPDATE; COMMIT on the hot row"
}
func (forUpdate) Setup(ctx context.Context, env Env) (Op, error) {
	start, end, err := resetUsage(ctx, env, []string{hotMember})
	if err != nil {
		return Op{}, err
	}
	return Op{Do: func(ctx context.Context, _ []int64) (Outcome, error) {
		granted, err := dbutil.WithTxResult(ctx, env.Pool, func(tx pgx.Tx) (bool, error) {
			return readCheckWrite(ctx, tx, sqlSelectForUpdate, start, end)
		})
		return Outcome{Granted: granted}, err
	}}, nil
}

// advisoryLock serializes on a transaction-level advisory lock, then reads,
// checks and updates the counter.
type advisoryLock struct{}

func (advisoryLock) Name() string { return "advisory-lock" }
func (advisoryLock) Describe() string {
	return "BEGIN; pg_advisory_xact_lock; SELECT; check in Go; UPDATE; COMMIT on the hot row"
}
func (advisoryLock) Setup(ctx context.Context, env Env) (Op, error) {
	start, end, err := resetUsage(ctx, env, []string{hotMember})
	if err != nil {
		return Op{}, err
	}
	return Op{Do: func(ctx context.Context, _ []int64) (Outcome, error) {
		granted, err := dbutil.WithTxResult(ctx, env.Pool, func(tx pgx.Tx) (bool, error) {
			if _, err := tx.Exec(ctx, sqlAdvisoryLock, advisoryKey); err != nil {
				return false, err
			}
			return readCheckWrite(ctx, tx, sqlSelect, start, end)
		})
		return Outcome{Granted: granted}, err
	}}, nil
}

// serializable reads, checks and updates the counter in a SERIALIZABLE
// transaction and retries the whole transaction, at once, on a
// serialization failure or deadlock (as pgbench --max-tries does).
type serializable struct{}

func (serializable) Name() string { return "serializable" }
func (serializable) Describe() string {
	return "BEGIN SERIALIZABLE; SELECT; check in Go; UPDATE; COMMIT on the hot row, retried on 40001/40P01"
}
func (serializable) Setup(ctx context.Context, env Env) (Op, error) {
	start, end, err := resetUsage(ctx, env, []string{hotMember})
	if err != nil {
		return Op{}, err
	}
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	return Op{
		MaxTries: -1,
		Do: func(ctx context.Context, _ []int64) (Outcome, error) {
			var out Outcome
			for {
				tx, err := env.Pool.BeginTx(ctx, opts)
				if err != nil {
					return out, err
				}
				granted, err := readCheckWrite(ctx, tx, sqlSelect, start, end)
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(context.WithoutCancel(ctx))
				}
				if err == nil {
					out.Granted = granted
					return out, nil
				}
				if !retryable(err) || ctx.Err() != nil {
					return out, err
				}
				out.Retries++
			}
		},
	}, nil
}

// retryable reports a serialization failure or a deadlock.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// voucherClaim is pgquota's counted voucher claim, a new member every call,
// all on one pool row.
type voucherClaim struct{}

func (voucherClaim) Name() string { return "voucher-claim" }
func (voucherClaim) Describe() string {
	return "pgquota Claim, one statement, a new member every call on one pool row"
}
func (voucherClaim) Setup(ctx context.Context, env Env) (Op, error) {
	if _, err := env.Pool.Exec(ctx, `TRUNCATE pgquota.voucher_pool CASCADE`); err != nil {
		return Op{}, fmt.Errorf("reset voucher pools: %w", err)
	}
	if _, err := env.vouchers().CreateCampaign(ctx, benchCampaign, quota.MaxUnits); err != nil {
		return Op{}, err
	}
	vouchers := env.vouchers()
	return Op{
		Vars: []Var{{Name: "member", Min: 1, Max: uniqueMax}},
		Do: func(ctx context.Context, vals []int64) (Outcome, error) {
			c, err := vouchers.Claim(ctx, voucher.ClaimRequest{Campaign: benchCampaign, Member: memberFromVar(vals)})
			return Outcome{Granted: c.Claimed && !c.Repeat}, err
		},
	}, nil
}
