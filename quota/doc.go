// Package quota makes "check, then act" safe on PostgreSQL.
//
// A service that checks a limit and then writes ("has this member used
// fewer than 5 grants today?") races every other client in the gap between
// the check and the write: a GC pause or a slow network is enough for a
// second client to pass the same check, and the limit is oversold
// (CWE-367, time-of-check to time-of-use). This package closes the gap
// inside the database.
//
// # Conditional updates (no lock)
//
// A calendar grant (Grant) and a counted voucher claim (voucher.Client.Claim,
// package quota/voucher) are one
// conditional update in which the check is the WHERE clause of the row
// being written, for example
//
//	UPDATE pgquota.usage SET used = used + $amount
//	WHERE quota_name = $quota AND member = $member AND window_start = ...
//	  AND used + $amount <= $limit
//
// Under READ COMMITTED, when a concurrent transaction has changed the row,
// PostgreSQL waits for it to finish and re-evaluates the WHERE clause
// against the newest committed version before writing (the PostgreSQL
// manual, section 13.2.1, "Read Committed Isolation Level"). Concurrent
// callers therefore serialize on the row and the limit holds, with no lock
// taken by the application and one round trip per call, including a
// member's first grant of a window (an upsert whose ON CONFLICT DO UPDATE
// clause carries the same guard).
//
// Each call is one SQL function call and one round trip (pgquota.grant,
// pgquota.claim and their keyed forms: docs/sql.md, where the same
// functions are a public SQL interface for psql and other languages). The
// other shapes lock what they decide on instead: rates (GCRA), fixed and
// rolling windows and grants against several quotas at once
// (GrantRequest.Quotas) lock their state rows in one order, read the clock
// after the last lock and write all or nothing (pgquota.grant_limits); a
// code campaign picks an unclaimed code with FOR UPDATE SKIP LOCKED.
//
// A denied grant or a sold-out claim is a result, not an error:
// GrantResult.Granted and voucher.ClaimResult.Claimed are false, and the result still
// reports current usage.
//
// # Hot rows: coalescing, sharding, batches
//
// A single counter row serializes its writers on the row lock, which each
// holds until its commit is flushed. A Client combines concurrent Grant
// calls, of one counter or of many, into one statement and one commit
// (group commit, the default: Config.Grouping); voucher.Client.CreateShardedCampaign splits a voucher pool's total across several rows;
// GrantBatch grants many requests in one statement and one commit. All
// three keep the total exact, and coalesced and batched grants decide the
// requests on one counter exactly as running them one after another would:
// the statement locks the counter at its newest version and adds
// pgquota.greedy_take of that value (queries/usage_batch.sql), and each
// request's outcome is replayed from the counter before and after.
//
// # Windows, rates and the one clock
//
// A quota's counters are kept per member and window: an hour, day, week or
// month cut in the quota's IANA time zone, or none (a lifetime cap); a
// fixed window of any length from an origin; a rolling window (at most N
// in any period of length W); or a rate with a burst (Window names the
// kind). Semaphores (package lease: AcquireSlot) limit how many hold at
// once, each holder a lease with its own fencing token. Every
// window boundary and every expiry is computed by the database clock
// (clock_timestamp(), through the SQL function pgquota.clock()), never by
// an application server's clock, and never by now(), which freezes at the
// start of a long transaction.
//
// # Using it
//
// New takes a *pgxpool.Pool. The calls that change quota, voucher, lease,
// fence, ledger and outbox state have a twin XTx that runs in the caller's
// pgx.Tx, so the application's own writes and pgquota's commit or roll back
// together (the exceptions, which own their transactions or wait between
// them, are listed on Client):
//
//	client, err := quota.New(pool, nil)
//	...
//	res, err := client.Grant(ctx, quota.GrantRequest{Quota: "api-calls", Member: "acme", Amount: 1})
//	if err != nil { ... }        // bad input, unknown quota, database error
//	if !res.Granted { ... }      // limit reached: res.Used, res.Limit, res.WindowEnd
//
// Apply the schema once with Client.Migrate or `pgquota migrate up`. The
// tables live in the schema pgquota, with goose's version table
// pgquota.pgquota_migrations, so an application that also uses goose never
// collides with pgquota. The application itself needs no DDL: make its role
// a member of pgquota_app (migrations.AppRole; `pgquota migrate grant-app
// --role ROLE`).
//
// Errors are sentinels (errors.Is): ErrInvalidInput, ErrQuotaNotFound,
// ErrQuotaKindChange, ErrNoLimit, ErrSchemaMissing, ErrSchemaNewer,
// ErrSchemaGap, ErrPermissionDenied, ErrIdempotencyKeyReused,
// ErrGrantNotFound, ErrGrantAbandoned and ErrOutcomeUnknown; or typed
// errors (errors.As): *InputError (which field, why) and
// *SchemaVersionError. `go doc quota ErrNoLimit` and the like say which
// calls return each. Database failures keep their *pgconn.PgError and
// SQLSTATE.
// Every error of a state-changing call is one of two kinds: nothing was
// written, or errors.Is(err, ErrOutcomeUnknown): the request was sent and
// no reply said how it ended, so it may have been applied (repeat with the
// idempotency key, or read the state, to learn the outcome).
//
// The idea and its limits are laid out in Martin Kleppmann, "How to do
// distributed locking" (2016): a lease alone cannot stop a paused client
// from writing; either the check and the write are one atomic step (this
// package's conditional updates), or the storage must reject writes carrying
// stale fencing tokens.
//
// # Packages
//
// This package is the client and the limits: quotas, grants, revokes, the
// ledger of idempotency keys and compensation. Each other capability is a
// package that builds its client on a Client (lease.New(client), ...):
//
//   - quota/voucher: voucher campaigns and claims;
//   - quota/lease: leases with fencing tokens, elections, semaphores;
//   - quota/fence: fenced rows and guarded tables, which reject the writes
//     of a deposed holder, and RunTx, a transaction under a fencing token;
//   - quota/outbox: the transactional outbox and its relay;
//   - quota/httprate: HTTP rate-limit fields and middleware;
//   - quota/quotatest: a migrated throwaway database for your tests;
//   - migrations (the module root's): the schema, for goose.
package quota
