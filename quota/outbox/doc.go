// Package outbox is pgquota's transactional outbox (Chris Richardson,
// "Pattern: Transactional outbox", microservices.io): an event that reports
// a change is written to a table in the same transaction as the change, so
// the event exists if and only if the change committed. A Relay then
// delivers it to the outside world (a message broker, an email or payment
// API) at least once, and consumers dedupe by the event's id.
//
// A grant and the event that reports it, committed together:
//
//	q, _ := quota.New(pool, nil)
//	events, _ := outbox.New(q)
//	err := quota.RunInTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//		g, err := q.GrantTx(ctx, tx, quota.GrantRequest{Quota: "points", Member: "alice", Amount: 50,
//			Idempotency: quota.IdempotencyKey{Key: orderID}})
//		if err != nil || !g.Granted || g.Replayed {
//			return err
//		}
//		_, err = events.EnqueueTx(ctx, tx, "points.granted", payload, &outbox.EnqueueOpts{GrantID: g.GrantID})
//		return err
//	})
//
// and a relay that delivers it (run it as the relay role,
// migrations.RelayRole; see docs/side-effects.md):
//
//	relay, _ := events.NewRelay(func(ctx context.Context, ev outbox.Event) error {
//		return publish(ctx, ev.ID, ev.Topic, ev.Payload)
//	}, outbox.RelayConfig{})
//	go relay.Run(ctx)
//
// Errors are pgquota's (package quota's sentinels, tested with errors.Is):
// *quota.InputError for bad arguments, quota.ErrSchemaMissing,
// quota.ErrPermissionDenied, quota.ErrOutcomeUnknown.
package outbox
