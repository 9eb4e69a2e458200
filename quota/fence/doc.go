// Package fence is the storage half of pgquota's fenced lock (package
// lease is the other): the database keeps the highest fencing token it has
// seen per resource and admits a write only when its token is at least
// that high, and, when the write names a lease, only while that lease is
// held with that token. A holder paused past its TTL wakes up to a refused
// write (ErrStaleToken, lease.ErrLost) instead of overwriting its
// successor's work.
//
// Two ways to fence a write: fenced rows, pgquota's own key-value table
// (WriteRow, Row, Rows, State); and guarded tables, the application's own
// tables with a trigger that refuses a statement unless its transaction
// presented a current token (GuardTable once, then PresentTokenTx, or RunTx,
// which presents, runs and commits):
//
//	q, _ := quota.New(pool, nil)
//	leases, _ := lease.New(q)
//	fences, _ := fence.New(q)
//	g, _ := fences.GuardTable(ctx, fence.GuardTableRequest{Table: "public.reports", Column: "fence_token"})
//	l, _ := leases.AcquireWait(ctx, lease.AcquireRequest{Name: g.Resource, TTL: 30 * time.Second}, nil)
//	err := fences.RunTx(ctx, fence.TxRequest{Resource: g.Resource, Token: l.Token}, func(tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `UPDATE public.reports SET status = 'done' WHERE id = 1`)
//		return err
//	})
//
// Tokens from another lock service (etcd, ZooKeeper) work too, mapped with
// ExternalToken onto tables guarded with GuardTableRequest.External.
//
// Errors: this package's sentinels (ErrStaleToken, ErrTokenNotPresented,
// ErrWrongLease, ErrRowNotFound, tested with errors.Is), lease.ErrLost,
// and package quota's: *quota.InputError for bad arguments,
// quota.ErrSchemaMissing, quota.ErrPermissionDenied, quota.ErrOutcomeUnknown.
package fence
