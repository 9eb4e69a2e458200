package quota

import (
	"errors"
	"fmt"

	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/dbutil"
	"github.com/pgquota/pgquota/migrations"
)

// Sentinel errors. Test for them with errors.Is; the typed errors below wrap
// them where a caller needs more data. Database failures that are not one of
// these keep their *pgconn.PgError in the chain (errors.As), so callers can
// read the SQLSTATE.
var (
	// ErrInvalidInput is wrapped by every *InputError: a call was given a
	// value it cannot accept, and nothing was written. Every call returns it
	// for bad arguments.
	ErrInvalidInput = core.ErrInvalidInput

	// ErrQuotaNotFound is returned by Grant, GrantTx, Revoke, RevokeTx,
	// Usage, Quota, SetMemberLimit, SetMemberLimitTx and MemberLimits when no
	// quota of that name has been defined, and is the error of a GrantBatch
	// or GrantBatchTx request (in its BatchOutcome) that names one.
	ErrQuotaNotFound = core.ErrQuotaNotFound

	// ErrQuotaKindChange is returned by DefineQuota and DefineQuotaTx when
	// the quota exists with another kind (Window: day and rate, say) and
	// Definition.ReplaceKind is false. Nothing is written. The message
	// says what a change of kind does to the counters (ReplaceKind deletes
	// them all) and how to ask for it.
	ErrQuotaKindChange = core.ErrQuotaKindChange

	// ErrNoLimit is returned by Grant and GrantTx, and is the error of a
	// GrantBatch or GrantBatchTx request (in its BatchOutcome), when the
	// call gives no limit, the member has no override and the quota has no
	// default limit. Nothing is written. (Usage reports the same case as
	// HasLimit false.)
	ErrNoLimit = core.ErrNoLimit

	// ErrSchemaMissing is returned by every call that reaches the database
	// when the pgquota schema is missing or older than this build needs
	// (the PostgreSQL error stays in the chain). Run `pgquota migrate up`
	// or Client.Migrate. CheckSchema returns it wrapped in a
	// *SchemaVersionError.
	ErrSchemaMissing = core.ErrSchemaMissing

	// ErrSchemaNewer is wrapped by CheckSchema's *SchemaVersionError, and by
	// the error of Migrate (a *migrations.SchemaError, which then applies
	// nothing), when the database has migrations this build of pgquota does
	// not know: a newer build migrated it. Upgrade pgquota, or roll back
	// with the newer build (pgquota migrate down --to N). It is
	// migrations.ErrSchemaNewer.
	ErrSchemaNewer = migrations.ErrSchemaNewer

	// ErrCitusWorker is CheckSchema's and Migrate's error (a
	// *migrations.CitusWorkerError naming the coordinator) on a database of
	// a Citus worker node: pgquota runs on the coordinator only (its
	// version table, lease token sequence, advisory locks and clock are
	// the coordinator's; docs/scaling.md). It is migrations.ErrCitusWorker.
	ErrCitusWorker = migrations.ErrCitusWorker

	// ErrSchemaGap is wrapped by CheckSchema's *SchemaVersionError and by
	// Migrate's error (which then applies nothing) when a migration of this
	// build below the database's newest applied one is not applied (applied
	// out of order, or its version row was removed). The message names it
	// and the way out: `pgquota migrate up --allow-missing` applies it. It
	// is migrations.ErrSchemaGap.
	ErrSchemaGap = migrations.ErrSchemaGap

	// ErrPermissionDenied is returned by every call that reaches the
	// database when PostgreSQL refuses it a privilege (SQLSTATE 42501; the
	// *pgconn.PgError stays in the chain). It is returned at once, never
	// retried. The message names the object, the privileges pgquota needs
	// on it and the fix: make the application's role a member of
	// migrations.AppRole (pgquota_app), with `pgquota migrate grant-app
	// --role ROLE` run as the schema's owner. The operator's calls
	// (DefineQuota and DefineQuotaTx of every kind, SetMemberLimit,
	// ClearMemberLimit, ReapLedger; voucher.Client's CreateCampaign,
	// CreateShardedCampaign and ImportCodes; lease.Client.BumpEpoch and
	// Reap; fence.Client.GuardTable) need
	// migrations.OperatorRole (`pgquota migrate grant-operator`), the
	// relay's (package outbox: Relay.Run, Relay.RunOnce, Client.Reap) migrations.RelayRole (`grant-relay`); the
	// message then names that role and command (docs/trust-model.md).
	// Nothing was written.
	ErrPermissionDenied = core.ErrPermissionDenied

	// ErrIdempotencyKeyReused is returned by Grant, GrantTx, Revoke,
	// RevokeTx, voucher.Client.Claim and ClaimTx when the idempotency key (in its scope) was
	// first used for a different request: another operation, quota or
	// campaign, member, amount or limit. Nothing is written. The message
	// names the first request's grant id and the field that differs. (The
	// "Idempotency-Key" IETF draft answers this case with 422.)
	ErrIdempotencyKeyReused = core.ErrIdempotencyKeyReused

	// ErrGrantNotFound is returned by CompensateGrant and CompensateGrantTx when no
	// keyed grant has that grant id (grants without an idempotency key have
	// none, and reaped ledger rows are gone: see ReapLedger), and by
	// LedgerEntry and LedgerEntryByKey when no ledger entry matches.
	ErrGrantNotFound = core.ErrGrantNotFound
)

// SQLStateQuotaNotFound is the SQLSTATE pgquota.grant, pgquota.grant_keyed
// and pgquota.limit_usage raise for a quota that does not exist
// (migrations/00021_sql_errors.sql; docs/sql.md). Every call maps it to
// ErrQuotaNotFound, with the *pgconn.PgError kept in the chain.
const SQLStateQuotaNotFound = core.SQLStateQuotaNotFound

// SQLState returns the SQLSTATE that reports err, for an output that
// carries one (the CLI's --json "sqlstate"): the code of the first
// *pgconn.PgError in err's chain when the server raised it; else
// SQLStateQuotaNotFound when err wraps ErrQuotaNotFound, which the
// library also learns from an empty read and pgquota's SQL functions raise
// as PQ010; else "".
func SQLState(err error) string {
	if code := core.SQLState(err); code != "" {
		return code
	}
	if errors.Is(err, ErrQuotaNotFound) {
		return SQLStateQuotaNotFound
	}
	return ""
}

// ErrOutcomeUnknown marks an error after which it is unknown whether a
// state-changing call took effect: its statement, or the COMMIT of the
// transaction it owns, may have reached the server, and no reply said how
// it ended (the connection was lost or the server shut down after the
// statement was sent, the context ended while it ran, a FATAL error ended
// the session). Every other error of a state-changing call means nothing
// was written (nothing written, or the outcome unknown). Test for it with errors.Is; the
// original error stays in the chain (errors.As to *pgconn.PgError, a
// net.Error, io.ErrUnexpectedEOF, context.Canceled, ...).
//
// The calls without a Tx suffix that change state can return it: Grant,
// GrantBatch, Revoke, CompensateGrant, DefineQuota, SetMemberLimit,
// ClearMemberLimit, ReapLedger, RunInTx (for its COMMIT); and in the
// capability packages voucher.Client's Claim, CreateCampaign,
// CreateShardedCampaign and ImportCodes, lease.Client's Acquire,
// AcquireWait, Renew and Release, fence.Client's WriteRow, GuardTable and
// RunTx (for its COMMIT), outbox.Client's Enqueue and Reap. pgquota never retries such an error blindly. Learn the outcome
// by repeating the call with the same idempotency key where it takes one
// (GrantRequest.Idempotency, RevokeRequest.Idempotency, the WithKey claims:
// the repeat returns the first outcome and changes nothing more), by
// repeating a call that is idempotent by itself (lease Acquire with the same
// lease.AcquireRequest.Attempt, Renew, Release, CompensateGrant, fence WriteRow of the
// same value, the creates and defines with the same arguments, a claim by
// the same member), or by reading the state (Usage, LedgerEntryByKey,
// lease.Client.Get, fence.Client.Row, outbox.Client.Events, voucher.Client.Campaign). An unkeyed Grant,
// GrantBatch, Revoke or outbox Enqueue repeated blindly may apply twice.
//
// The XTx calls never return it: their statements run in the caller's
// transaction, which commits only when the caller commits it (a statement
// whose reply was lost leaves the transaction unable to commit). The
// caller's own COMMIT decides, and pgx reports its error.
var ErrOutcomeUnknown = dbutil.ErrOutcomeUnknown

// InputError describes a rejected argument: Field names the argument, as
// in the call's documentation ("member", "amount", "limit", "time zone",
// ...), and Reason says what is wrong with it, in a few words. Its Error
// reads "pgquota: invalid FIELD: REASON". It wraps ErrInvalidInput.
type InputError = core.InputError

// SchemaVersionError is returned by CheckSchema when the database's pgquota
// schema is not at the version this build needs. It wraps ErrSchemaMissing
// when the schema is missing or behind (Have < Want), ErrSchemaNewer when
// Unknown is not empty and ErrSchemaGap when Missing is not empty.
type SchemaVersionError struct {
	// Have is the database's migration version (0 when the schema is absent).
	Have int64
	// Want is the newest migration embedded in this build.
	Want int64
	// Unknown lists applied migrations this build does not have.
	Unknown []int64
	// Missing lists this build's migrations below Have that are not applied.
	Missing []int64
}

func (e *SchemaVersionError) Error() string {
	if len(e.Unknown) > 0 || len(e.Missing) > 0 {
		return (&migrations.SchemaError{Current: e.Have, Latest: e.Want, Unknown: e.Unknown, Missing: e.Missing}).Error()
	}
	if e.Have == 0 {
		return "pgquota: schema is missing: run `pgquota migrate up`"
	}
	return fmt.Sprintf("pgquota: schema is at version %d, this build needs %d: run `pgquota migrate up`", e.Have, e.Want)
}

// Unwrap returns ErrSchemaMissing when the schema is missing or behind,
// ErrSchemaNewer when it has migrations this build does not know, and
// ErrSchemaGap when one below its newest is not applied.
func (e *SchemaVersionError) Unwrap() []error {
	var out []error
	if e.Have < e.Want && len(e.Unknown) == 0 {
		out = append(out, ErrSchemaMissing)
	}
	if len(e.Unknown) > 0 {
		out = append(out, ErrSchemaNewer)
	}
	if len(e.Missing) > 0 {
		out = append(out, ErrSchemaGap)
	}
	return out
}

// Sentinel errors of coalesced and batched grants (coalesce.go, batch.go).
var (
	// ErrGrantAbandoned is returned by Grant (grouped: Config.Grouping,
	// GroupAcrossCounters by default, or GroupByCounter) when the caller's
	// context ended after its call had been sent to the database in a
	// shared statement (the error also wraps
	// ErrOutcomeUnknown, since the caller cannot tell the outcome, and the
	// context's error).
	// The database decides the call anyway: its units are granted or not,
	// exactly as if the caller had waited, and the outcome is passed to
	// Config.OnAbandonedGrant. A call whose context ends before it is sent
	// is removed from its queue and returns the context's error alone:
	// nothing was granted for it.
	ErrGrantAbandoned = core.ErrGrantAbandoned
)
