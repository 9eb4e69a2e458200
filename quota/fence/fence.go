package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/internal/core"
	"github.com/pgquota/pgquota/internal/dbutil"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota/lease"
)

// Fenced rows: the storage half of the fenced lock. The database keeps the
// highest fencing token it has seen per resource (table pgquota.fence) and
// admits a write carrying token T only when T is at least that high, for
// whichever key of the resource the write touches (Kleppmann 2016: "the
// storage server remembers that it has already processed a write with a
// higher token number, and so it rejects the request"). Equal tokens are
// admitted: a token is issued to exactly one acquisition, so an equal
// token is the current holder writing again.

// SQLSTATEs raised by pgquota's fence (class PQ, which PostgreSQL does not
// use). MapError turns them into ErrStaleToken, lease.ErrLost,
// ErrTokenNotPresented and ErrWrongLease.
const (
	// SQLStateStaleToken is raised when a write's fencing token is below the
	// highest token seen for its resource, or is NULL, by fenced writes, by
	// pgquota.present_token (PresentTokenTx), and by the guard of an
	// application table when the token its transaction presented was
	// overtaken. The error's DETAIL is a JSON object {"resource": text,
	// "token": bigint|null, "highest": bigint}; the message names the
	// resource and both tokens.
	SQLStateStaleToken = "PQ001"
	// SQLStateLeaseNotHeld is raised when a fenced write, or a token
	// presented with PresentTokenTx, is checked against a pgquota lease that
	// is not held with the token (expired, released, or never acquired with
	// it: a token above every one issued lands here). DETAIL is a JSON
	// object {"lease": text, "token": bigint}.
	SQLStateLeaseNotHeld = "PQ002"
	// SQLStateTokenNotPresented is raised by the guard of a table attached
	// with GuardTable when a statement on it (INSERT, UPDATE, DELETE
	// or TRUNCATE) runs in a transaction that presented no fencing token for
	// the table's resource (PresentTokenTx, pgquota.present_token), or whose
	// token for it was not admitted by pgquota.present_token (set by hand,
	// above the highest admitted). DETAIL is a JSON object {"resource":
	// text, "table": text, "operation": text, "token": bigint|null,
	// "highest": bigint}. MapError maps it to ErrTokenNotPresented.
	SQLStateTokenNotPresented = "PQ003"
	// SQLStateWrongLease is raised by fenced writes, pgquota.present_token
	// (PresentTokenTx) and the guard when the token comes with a lease
	// other than the one the resource is bound to (GuardTableRequest.Lease,
	// by default the lease named like the resource), with a lease that is
	// not a slot of the semaphore it is bound to (GuardTableRequest.Semaphore),
	// or with any lease for a resource bound to external tokens. Nothing is
	// written and no mark moves. DETAIL is a JSON object {"resource": text,
	// "lease": text|null, "token": bigint, "bound": text|null, "binding":
	// "lease"|"semaphore"|"external"}. MapError maps it to
	// ErrWrongLease.
	SQLStateWrongLease = "PQ004"
)

// MaxValueBytes is the largest fenced value accepted, in bytes.
const MaxValueBytes = 1 << 20

// StaleTokenError is returned when a fenced write is rejected because its
// token is stale. It wraps ErrStaleToken and, when the rejection came from
// the database, the *pgconn.PgError (SQLSTATE PQ001).
type StaleTokenError struct {
	// Resource is the fenced resource.
	Resource string
	// Token is the token the write carried; 0 when it carried none.
	Token int64
	// Highest is the highest token the database had seen for the resource
	// (or the token of the lease the write was checked against) when it
	// rejected the write.
	Highest int64

	pgErr *pgconn.PgError
}

func (e *StaleTokenError) Error() string {
	if e.pgErr != nil && strings.Contains(e.pgErr.Message, " was acquired since ") &&
		!strings.Contains(e.pgErr.Message, ": lease "+e.Resource+" was acquired since ") {
		// Rejected by a lease of another name than the resource, which
		// another holder has acquired since: the server's message names
		// that lease and its token, which the resource may never have
		// seen. (Acquiring a lease raises the highest token seen of the
		// resource of its own name, so there the usual message holds.)
		return "pgquota: " + strings.TrimPrefix(e.pgErr.Message, "pgquota: ")
	}
	if e.Token == 0 {
		return fmt.Sprintf("pgquota: stale fencing token: a write to resource %q carries no token (highest token seen is %d)", e.Resource, e.Highest)
	}
	return fmt.Sprintf("pgquota: stale fencing token %d for resource %q: highest token seen is %d", e.Token, e.Resource, e.Highest)
}

// Unwrap returns ErrStaleToken and the database error, if any.
func (e *StaleTokenError) Unwrap() []error {
	if e.pgErr == nil {
		return []error{ErrStaleToken}
	}
	return []error{ErrStaleToken, e.pgErr}
}

// MapError maps an error raised by pgquota's fence in the database to
// the library's errors: SQLSTATE PQ001 becomes a *StaleTokenError
// (ErrStaleToken), PQ002 an error wrapping lease.ErrLost, PQ003 one
// wrapping ErrTokenNotPresented and PQ004 one wrapping ErrWrongLease, each keeping the *pgconn.PgError in the
// chain. Any other error, and nil, is returned
// unchanged. Use it on errors from your own statements on a table guarded
// by GuardTable; pgquota's own calls apply it already.
func MapError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case SQLStateStaleToken:
		var d struct {
			Resource string `json:"resource"`
			Token    *int64 `json:"token"`
			Highest  *int64 `json:"highest"`
		}
		_ = json.Unmarshal([]byte(pgErr.Detail), &d)
		e := &StaleTokenError{Resource: d.Resource, pgErr: pgErr}
		if d.Token != nil {
			e.Token = *d.Token
		}
		if d.Highest != nil {
			e.Highest = *d.Highest
		}
		return e
	case SQLStateLeaseNotHeld:
		return &leaseNotHeldError{pgErr: pgErr}
	case SQLStateTokenNotPresented:
		return &tokenNotPresentedError{pgErr: pgErr, sentinel: ErrTokenNotPresented}
	case SQLStateWrongLease:
		return &tokenNotPresentedError{pgErr: pgErr, sentinel: ErrWrongLease}
	}
	return err
}

// leaseNotHeldError is MapError's error for SQLSTATE PQ002. Its text is
// the server's message once (wrapping the *pgconn.PgError with %w would
// print it twice); it unwraps to lease.ErrLost and the *pgconn.PgError.
type leaseNotHeldError struct{ pgErr *pgconn.PgError }

func (e *leaseNotHeldError) Error() string {
	return fmt.Sprintf("pgquota: lease lost: %s (SQLSTATE %s)", strings.TrimPrefix(e.pgErr.Message, "pgquota: "), e.pgErr.Code)
}

func (e *leaseNotHeldError) Unwrap() []error { return []error{lease.ErrLost, e.pgErr} }

// tokenNotPresentedError is MapError's error for SQLSTATEs PQ003 and
// PQ004: the server's message once; it unwraps to its sentinel
// (ErrTokenNotPresented, ErrWrongLease) and the *pgconn.PgError.
type tokenNotPresentedError struct {
	pgErr    *pgconn.PgError
	sentinel error
}

func (e *tokenNotPresentedError) Error() string {
	return fmt.Sprintf("pgquota: %s (SQLSTATE %s)", strings.TrimPrefix(e.pgErr.Message, "pgquota: "), e.pgErr.Code)
}

func (e *tokenNotPresentedError) Unwrap() []error { return []error{e.sentinel, e.pgErr} }

// WriteRowRequest is one fenced write.
type WriteRowRequest struct {
	// Resource is what the token fences: its highest token seen is shared
	// by every key. 1 to quota.MaxNameBytes bytes, no control characters.
	Resource string
	// Key is the row of the resource to write. 1 to quota.MaxNameBytes bytes, no
	// control characters.
	Key string
	// Value is the row's new value: valid UTF-8 without NUL, at most
	// MaxValueBytes bytes; may be empty.
	Value string
	// Token is the writer's fencing token, at least 1: a pgquota lease's
	// Token, or a number from an external lock service that increases with
	// every acquisition (an etcd revision, a ZooKeeper zxid).
	Token int64
	// Lease names the pgquota lease that issued Token, usually the same as
	// Resource. When set, the write is admitted only while that lease is
	// held with Token by the database clock, and the lease row is locked
	// FOR KEY SHARE in the same statement, so a takeover cannot slip in
	// between the check and the write (renewals do not wait for it). Leave
	// it empty for tokens from an external lock service: only the
	// highest-token check applies then. On the resource of a guarded table
	// the table's binding decides (GuardTableRequest): another lease than
	// the bound one is refused with ErrWrongLease (PQ004), and empty means
	// the bound lease.
	Lease string
}

// Row is a row of the generic fenced-row table.
type Row struct {
	Resource string `json:"resource"`
	Key      string `json:"key"`
	Value    string `json:"value"`
	// Token is the fencing token of the write that stored Value.
	Token     int64     `json:"token"`
	UpdatedAt time.Time `json:"updated_at"`
}

// State is the storage side of a resource's fence.
type State struct {
	Resource string `json:"resource"`
	// Highest is the highest token admitted for the resource; 0 before the
	// first fenced write.
	Highest   int64     `json:"highest_token"`
	UpdatedAt time.Time `json:"updated_at"`
}

func checkFenceWrite(req WriteRowRequest) error {
	if err := core.CheckName("resource", req.Resource); err != nil {
		return err
	}
	if err := core.CheckName("key", req.Key); err != nil {
		return err
	}
	switch {
	case len(req.Value) > MaxValueBytes:
		return core.Invalid("value", "is %d bytes long, the limit is %d", len(req.Value), MaxValueBytes)
	case !utf8.ValidString(req.Value):
		return core.Invalid("value", "is not valid UTF-8")
	case strings.IndexByte(req.Value, 0) >= 0:
		return core.Invalid("value", "must not contain NUL")
	}
	if err := core.CheckToken(req.Token); err != nil {
		return err
	}
	if req.Lease != "" {
		return core.CheckName("lease name", req.Lease)
	}
	return nil
}

// WriteRow stores req.Value under (req.Resource, req.Key) if req.Token is
// at least the highest token seen for req.Resource, raising that mark to
// req.Token; with req.Lease set, only while that lease is held with
// req.Token (on a guarded table's resource, the lease it is bound to; see
// GuardTableRequest). It is one SQL statement and one round trip (see
// queries/fenced_row.sql and pgquota.fence_admit in the migrations).
// Equal tokens are admitted, so the current holder can write any number of
// times.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) for a bad resource, key, value,
// token or lease name; *StaleTokenError (ErrStaleToken) when the token is
// below the highest seen for the resource, whichever key it was for, or
// below the token of req.Lease; lease.ErrLost when req.Lease is not held with
// req.Token (expired or released); ErrWrongLease (SQLSTATE PQ004) when the
// resource is bound to another lease or semaphore, or to external tokens
// and req.Lease is set; quota.ErrSchemaMissing; database errors.
// Nothing is written on an error other than quota.ErrOutcomeUnknown (below).
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, read the row (Row), or repeat the
// write with the same token and value.
func (c *Client) WriteRow(ctx context.Context, req WriteRowRequest) (_ Row, err error) {
	defer c.core.M.FenceDone(ctx, c.core.M.Now(), &err)
	return c.fenceWrite(ctx, c.core.DB, req)
}

// WriteRowTx is WriteRow inside the caller's transaction, so the
// caller's own writes commit only together with an admitted fenced write.
// Until tx ends, the resource's high-water row stays locked (other fenced
// writers of the resource wait) and, with req.Lease set, the lease row is
// locked FOR KEY SHARE: no one can take the lease over (the holder's own
// renewals do not wait), so keep such transactions short. A rejection aborts
// tx, as any failed statement does.
func (c *Client) WriteRowTx(ctx context.Context, tx pgx.Tx, req WriteRowRequest) (_ Row, err error) {
	defer c.core.M.FenceDone(ctx, c.core.M.Now(), &err)
	return c.fenceWrite(ctx, tx, req)
}

func (c *Client) fenceWrite(ctx context.Context, x db.DBTX, req WriteRowRequest) (Row, error) {
	if err := checkFenceWrite(req); err != nil {
		return Row{}, err
	}
	var lease pgtype.Text
	if req.Lease != "" {
		lease = pgtype.Text{String: req.Lease, Valid: true}
	}
	r, err := c.core.Queries.FencedRowWrite(ctx, x, db.FencedRowWriteParams{
		Resource: req.Resource, Key: req.Key, Value: req.Value, Token: req.Token, Lease: lease,
	})
	if core.IsNoRows(err) {
		// Only the row's own backstop guard can get here: the fence admitted
		// the token, yet the row holds a higher one.
		return Row{}, &StaleTokenError{Resource: req.Resource, Token: req.Token, Highest: req.Token + 1}
	}
	if err != nil {
		return Row{}, fenceDBError("fenced write", err)
	}
	return fencedRowFrom(r), nil
}

// fenceDBError maps the fence's SQLSTATEs (MapError), then wraps other
// database errors like dbError.
func fenceDBError(op string, err error) error {
	if mapped := MapError(err); mapped != err {
		return mapped
	}
	return core.DBError(op, err)
}

func fencedRowFrom(r db.PgquotaFencedRow) Row {
	return Row{Resource: r.Resource, Key: r.Key, Value: r.Value, Token: r.FenceToken, UpdatedAt: core.TimeFromPG(r.UpdatedAt)}
}

// Row reads one fenced row.
//
// Errors: *quota.InputError for a bad resource or key; ErrRowNotFound;
// quota.ErrSchemaMissing; database errors.
func (c *Client) Row(ctx context.Context, resource, key string) (Row, error) {
	if err := core.CheckName("resource", resource); err != nil {
		return Row{}, err
	}
	if err := core.CheckName("key", key); err != nil {
		return Row{}, err
	}
	r, err := c.core.Queries.FencedRowGet(ctx, c.core.DB.Reads(), db.FencedRowGetParams{Resource: resource, Key: key})
	if core.IsNoRows(err) {
		return Row{}, core.Errorf("%w: resource %q, key %q", ErrRowNotFound, resource, key)
	}
	if err != nil {
		return Row{}, core.DBError("read fenced row", err)
	}
	return fencedRowFrom(r), nil
}

// Rows lists a resource's fenced rows, ordered by key.
//
// Errors: *quota.InputError for a bad resource; quota.ErrSchemaMissing; database
// errors.
func (c *Client) Rows(ctx context.Context, resource string) ([]Row, error) {
	if err := core.CheckName("resource", resource); err != nil {
		return nil, err
	}
	rows, err := core.Retry(ctx, c.core.Policy, func() ([]db.PgquotaFencedRow, error) { return c.core.Queries.FencedRowList(ctx, c.core.Pool, resource) })
	if err != nil {
		return nil, core.DBError("list fenced rows", err)
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = fencedRowFrom(r)
	}
	return out, nil
}

// State returns the highest token seen for resource (0 before its first
// fenced write).
//
// Errors: *quota.InputError for a bad resource; quota.ErrSchemaMissing; database
// errors.
func (c *Client) State(ctx context.Context, resource string) (State, error) {
	if err := core.CheckName("resource", resource); err != nil {
		return State{}, err
	}
	r, err := c.core.Queries.FenceGet(ctx, c.core.DB.Reads(), resource)
	if core.IsNoRows(err) {
		return State{Resource: resource}, nil
	}
	if err != nil {
		return State{}, core.DBError("read fence", err)
	}
	return State{Resource: r.Resource, Highest: r.MaxToken, UpdatedAt: core.TimeFromPG(r.UpdatedAt)}, nil
}

// Names of the triggers GuardTable creates. The row trigger keeps the
// name of the first form of the guard (INSERT and UPDATE only, reading the
// token from the row), so attaching again replaces it in place.
const (
	// GuardTrigger is the BEFORE INSERT OR UPDATE OR DELETE row
	// trigger.
	GuardTrigger = "pgquota_fence_guard"
	// GuardTruncateTrigger is the BEFORE TRUNCATE statement trigger.
	GuardTruncateTrigger = "pgquota_fence_guard_truncate"
)

// GuardTableRequest names an application table to guard.
type GuardTableRequest struct {
	// Table is a table name as PostgreSQL parses it, optionally
	// schema-qualified ("orders", "app.orders", `"Orders"`): an ordinary or
	// partitioned table that is not one of pgquota's own.
	Table string
	// Column is the token column's name exactly as stored (lower case
	// unless created quoted), of type bigint. The guard stamps the token
	// presented by the writing transaction into it on every INSERT and
	// UPDATE, whatever the statement set it to.
	Column string
	// External says the table's tokens come from another lock service that
	// increases them with every holder (an etcd revision, a ZooKeeper
	// zxid), not from a pgquota lease: PresentTokenTx then checks a token
	// only against the highest seen for the resource. Leave it false for
	// pgquota leases: a presented token must then belong to the lease that
	// is held now, so a token no lease issued (too high, or invented) is
	// refused instead of locking the real holder out.
	External bool
	// Lease binds the table to the pgquota lease of that name: only a
	// token it issued, while it is held with it, writes the table (or a
	// fenced row of its resource); a token of any other lease is refused
	// with SQLSTATE PQ004 (ErrWrongLease). Empty means the lease named like
	// the table's resource (GuardedTable.Resource). Excludes External and
	// Semaphore. 1 to quota.MaxNameBytes bytes, no control characters.
	Lease string
	// Semaphore binds the table to the semaphore of that name (lease.Client.AcquireSlot):
	// every slot of it held now writes the table, presenting its own
	// token with its lease.Slot.Lease (or no lease: the slot holding the token is
	// found); no holder locks another out, and a slot that expired or was
	// taken over is refused. Excludes External and Lease. 1 to
	// MaxSemaphoreNameBytes bytes, no control characters.
	Semaphore string
}

// GuardedTable describes a guard attached to an application table.
type GuardedTable struct {
	// Table is the guarded table, schema-qualified and quoted as SQL.
	Table string `json:"table"`
	// Column is the token column.
	Column string `json:"column"`
	// Resource is the fence resource writers present their token for
	// (PresentTokenTx, pgquota.present_token): "schema.table", quoted where
	// SQL needs it. A WriteRow with this Resource shares the same highest
	// token seen, and for a lease-backed table the lease of this name is the
	// one a presented token is checked against by default.
	Resource string `json:"resource"`
	// External is the request's External: true when tokens are checked
	// against the highest seen only, false when they must belong to the
	// pgquota lease held now.
	External bool `json:"external"`
	// Lease is the lease the table is bound to ("" when bound to a
	// semaphore or external).
	Lease string `json:"lease,omitempty"`
	// Semaphore is the semaphore the table is bound to, if any.
	Semaphore string `json:"semaphore,omitempty"`
	// Trigger is the row trigger's name, GuardTrigger.
	Trigger string `json:"trigger"`
	// TruncateTrigger is the TRUNCATE trigger's name,
	// GuardTruncateTrigger.
	TruncateTrigger string `json:"truncate_trigger"`
	// Upgraded is true when the table had a trigger of the first form of
	// the guard (pgquota.fence_guard, which read the token from the row and
	// guarded neither DELETE nor TRUNCATE) and this call replaced it.
	Upgraded bool `json:"upgraded"`
}

// GuardTable attaches pgquota's fence guard to an application table,
// so that the database itself rejects stale writes, also from code that
// bypasses pgquota (psql, another service, a migration script): every
// INSERT, UPDATE, DELETE and TRUNCATE of the table lands only when its
// transaction has presented a current fencing token for the table's
// resource (GuardedTable.Resource), with PresentTokenTx or in SQL
//
//	BEGIN;
//	SELECT pgquota.present_token('public.orders', 42);
//	UPDATE public.orders SET status = 'paid' WHERE id = 1;
//	COMMIT;
//
// whatever columns the statements set. Row triggers (BEFORE INSERT OR
// UPDATE OR DELETE, GuardTrigger) and a statement trigger (BEFORE
// TRUNCATE, GuardTruncateTrigger) call pgquota.fence_guard_presented,
// which requires the presented token to still be the highest seen for the
// resource and stamps it into req.Column of every inserted or updated row.
// A statement in a transaction that presented no token for the resource
// fails with SQLSTATE PQ003 (SQLStateTokenNotPresented, ErrTokenNotPresented
// through MapError); one whose token was overtaken with PQ001
// (ErrStaleToken). The table is bound to one source of tokens
// (req.Lease, default the lease named like GuardedTable.Resource;
// req.Semaphore; or req.External): a token of any other lease is refused
// with PQ004 (ErrWrongLease) and moves no mark. The presenting transaction
// holds the lease row FOR KEY SHARE until it ends (the holder's renewals do
// not wait; a successor's acquire does), and for a lease-bound or external
// table the resource's high-water row, so writers of the table serialize.
// A table with INHERITS parents or children is refused. GuardedTables
// reports a guard that will not fire (disabled, replica-only, bypassed). This is the storage half of Kleppmann's fencing
// (2016); the triggers follow the PostgreSQL manual, chapter 39 (Triggers).
//
// Attaching again replaces the triggers (idempotent) and records
// req.External; a trigger of the first form of the guard (which read the
// token from the row) on the table is dropped in the same transaction and
// reported as GuardedTable.Upgraded. Row triggers of a partitioned table are
// cloned to its partitions, the TRUNCATE trigger is not: a TRUNCATE naming
// a partition directly is not guarded. To detach: DROP TRIGGER
// pgquota_fence_guard ON the table; DROP TRIGGER
// pgquota_fence_guard_truncate ON the table.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) when the table name does not parse,
// the table or column does not exist, the table is one of pgquota's own or
// takes part in table inheritance, the column is not a bigint, the table
// is a Citus distributed or reference table (its rows are in workers'
// shards, where the guard's trigger cannot see the presented token), or the
// binding is bad (External with Lease or Semaphore, both Lease and
// Semaphore, a bad name); quota.ErrSchemaMissing; quota.ErrPermissionDenied (42501)
// when the role is not a member of pgquota_operator, lacks the TRIGGER
// privilege on the table, or (replacing a first-form guard) does not own
// it, the message naming which and the GRANT that fixes it; other database
// errors. Nothing is changed on an error.
//
// quota.ErrOutcomeUnknown: the request (its statement, or its transaction's
// COMMIT) was sent and no reply said how it ended, so it may have been
// applied; to learn the outcome, repeat the call (attaching again replaces
// the triggers).
func (c *Client) GuardTable(ctx context.Context, req GuardTableRequest) (GuardedTable, error) {
	return core.Retry(ctx, c.core.Policy, func() (GuardedTable, error) {
		return dbutil.WithTxResult(ctx, c.core.Pool, func(tx pgx.Tx) (GuardedTable, error) {
			return c.attachFenceGuard(ctx, tx, req)
		})
	})
}

// GuardTableTx is GuardTable inside the caller's transaction:
// the guard takes effect when tx commits.
func (c *Client) GuardTableTx(ctx context.Context, tx pgx.Tx, req GuardTableRequest) (GuardedTable, error) {
	return c.attachFenceGuard(ctx, tx, req)
}

func (c *Client) attachFenceGuard(ctx context.Context, tx pgx.Tx, req GuardTableRequest) (GuardedTable, error) {
	table, column := req.Table, req.Column
	if err := core.CheckName("table", table); err != nil {
		return GuardedTable{}, err
	}
	if err := core.CheckName("column", column); err != nil {
		return GuardedTable{}, err
	}
	switch {
	case req.External && (req.Lease != "" || req.Semaphore != ""):
		return GuardedTable{}, core.Invalid("external", "excludes a lease or a semaphore: a table takes tokens of one source")
	case req.Lease != "" && req.Semaphore != "":
		return GuardedTable{}, core.Invalid("semaphore", "excludes a lease: a table is bound to one lease or one semaphore")
	case req.Lease != "":
		if err := core.CheckName("lease name", req.Lease); err != nil {
			return GuardedTable{}, err
		}
	case req.Semaphore != "":
		if err := core.CheckSemaphoreName(req.Semaphore); err != nil {
			return GuardedTable{}, err
		}
	}
	var nsp, rel, resource string
	var found bool
	err := tx.QueryRow(ctx, `
		SELECT n.nspname, c.relname, format('%I.%I', n.nspname, c.relname), true
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, table).Scan(&nsp, &rel, &resource, &found)
	if core.IsNoRows(err) {
		return GuardedTable{}, core.Invalid("table", "%q is not a table the database knows", table)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42602" || pgErr.Code == "42601" || pgErr.Code == "0A000") {
		// to_regclass parses the name: a syntax error (42602 invalid name
		// syntax, 42601 too many dotted names) or a cross-database
		// reference (0A000) is bad input, not a database failure.
		return GuardedTable{}, core.Invalid("table", "%q is not a valid table name: %s", table, pgErr.Message)
	}
	if err != nil {
		return GuardedTable{}, core.DBError("attach fence guard", err)
	}
	if nsp == migrations.Schema {
		// pgquota.fence_admit writes pgquota's own tables: a guard on one
		// of them would call itself on every fenced write.
		return GuardedTable{}, core.Invalid("table", "%s is one of pgquota's own tables", resource)
	}
	var typ string
	err = tx.QueryRow(ctx, `
		SELECT a.atttypid::regtype::text FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`,
		table, column).Scan(&typ)
	if core.IsNoRows(err) {
		return GuardedTable{}, core.Invalid("column", "%q is not a column of %s", column, resource)
	}
	if err != nil {
		return GuardedTable{}, core.DBError("attach fence guard", err)
	}
	if typ != "bigint" {
		// Fencing tokens are 64-bit: a lease token need not fit a smaller
		// column.
		return GuardedTable{}, core.Invalid("column", "%s.%s is of type %s, it must be bigint (fencing tokens are 64-bit)", resource, column, typ)
	}
	if err := refuseCitusShardedTable(ctx, tx, table, resource); err != nil {
		return GuardedTable{}, err
	}
	// Inheritance children: a statement on the parent reads and writes
	// their rows, and a statement on a child bypasses the parent's triggers.
	// Partitions are covered (row triggers are cloned to them).
	var children []string
	crows, err := tx.Query(ctx, `
		SELECT format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_inherits i
		JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE (i.inhparent = to_regclass($1) OR i.inhrelid = to_regclass($1)) AND NOT c.relispartition
		ORDER BY 1`, table)
	if err == nil {
		children, err = pgx.CollectRows(crows, pgx.RowTo[string])
	}
	if err != nil {
		return GuardedTable{}, core.DBError("attach fence guard", err)
	}
	if len(children) > 0 {
		return GuardedTable{}, core.Invalid("table", "%s takes part in table inheritance (INHERITS: %s): statements on a parent change its children's rows, "+
			"and the guard cannot cover them; guard a table without INHERITS children or parents, or use declarative partitioning",
			resource, strings.Join(children, ", "))
	}
	ident := pgx.Identifier{nsp, rel}.Sanitize()
	// Triggers of the first form of the guard on this table, under any
	// name: dropped, so that no write is checked by the old rule alone.
	var old []string
	rows, err := tx.Query(ctx, `
		SELECT t.tgname FROM pg_catalog.pg_trigger t
		JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
		JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE t.tgrelid = to_regclass($1) AND NOT t.tgisinternal
		  AND n.nspname = $2 AND p.proname = 'fence_guard'
		ORDER BY t.tgname`, table, migrations.Schema)
	if err == nil {
		old, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return GuardedTable{}, core.DBError("attach fence guard", err)
	}
	for _, name := range old {
		if _, err := tx.Exec(ctx, `DROP TRIGGER `+pgx.Identifier{name}.Sanitize()+` ON `+ident); err != nil {
			return GuardedTable{}, guardTriggerError(resource, err)
		}
	}
	var bindLease, bindSemaphore pgtype.Text
	switch {
	case req.Semaphore != "":
		bindSemaphore = pgtype.Text{String: req.Semaphore, Valid: true}
	case !req.External && req.Lease != "":
		bindLease = pgtype.Text{String: req.Lease, Valid: true}
	case !req.External:
		bindLease = pgtype.Text{String: resource, Valid: true}
	}
	args := quoteLiteral(column) + `, ` + quoteLiteral(resource)
	_, err = tx.Exec(ctx, `CREATE OR REPLACE TRIGGER `+GuardTrigger+
		` BEFORE INSERT OR UPDATE OR DELETE ON `+ident+
		` FOR EACH ROW EXECUTE FUNCTION pgquota.fence_guard_presented(`+args+`)`)
	if err == nil {
		_, err = tx.Exec(ctx, `CREATE OR REPLACE TRIGGER `+GuardTruncateTrigger+
			` BEFORE TRUNCATE ON `+ident+
			` FOR EACH STATEMENT EXECUTE FUNCTION pgquota.fence_guard_presented(`+args+`)`)
	}
	if err != nil {
		return GuardedTable{}, guardTriggerError(resource, err)
	}
	// pgquota.fence_guard_register (migrations/00022): the operator's
	// SECURITY DEFINER function, the caller holds no table privilege.
	_, err = tx.Exec(ctx, `SELECT pgquota.fence_guard_register($1::text, $2::boolean, $3::text, $4::text)`,
		resource, req.External, bindLease, bindSemaphore)
	if err != nil {
		return GuardedTable{}, core.DBError("attach fence guard", err)
	}
	return GuardedTable{
		Table: ident, Column: column, Resource: resource, External: req.External,
		Lease: bindLease.String, Semaphore: bindSemaphore.String,
		Trigger: GuardTrigger, TruncateTrigger: GuardTruncateTrigger, Upgraded: len(old) > 0,
	}, nil
}

// guardTriggerError is attachFenceGuard's error for a failed DROP TRIGGER
// or CREATE TRIGGER on the guarded table. A permission error there is
// about the user's table, not pgquota's schema: CREATE TRIGGER needs the
// TRIGGER privilege on the table and DROP TRIGGER (an older guard being
// replaced) its ownership (PostgreSQL manual, CREATE TRIGGER and DROP
// TRIGGER). A permission error on pgquota.fence_guard_presented is
// dbError's (the operator role's function).
func guardTriggerError(resource string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" && !strings.Contains(pgErr.Message, " function ") {
		return core.Errorf("pgquota: attach fence guard: %w: attaching a guard creates triggers on %s, which needs the TRIGGER privilege on it "+
			"(replacing an older guard needs its ownership): as its owner run GRANT TRIGGER ON %s TO ROLE, or attach the guard as the table's owner; "+
			"the role must also be a member of %s: %w",
			core.ErrPermissionDenied, resource, resource, migrations.OperatorRole, err)
	}
	return core.DBError("attach fence guard", err)
}

// PresentTokenRequest is a fencing token presented for the statements of
// one transaction on a guarded table.
type PresentTokenRequest struct {
	// Resource is the guarded table's GuardedTable.Resource ("public.orders"),
	// or any fence resource. 1 to quota.MaxNameBytes bytes, no control
	// characters.
	Resource string
	// Token is the writer's fencing token, at least 1: the Token of the
	// pgquota lease it holds, or, for a table attached with External, the
	// number from the external lock service.
	Token int64
	// Lease names the pgquota lease that issued Token. Empty means the
	// lease named like Resource, for a table attached without External;
	// for an External table, empty means no lease is checked.
	Lease string
}

// PresentTokenTx presents req.Token for req.Resource in the caller's
// transaction, so that the transaction's statements on a table guarded by
// GuardTable with that resource land, stamped with the token, until tx
// ends. It is one statement, SELECT pgquota.present_token(resource, token,
// lease), which a program without this library runs the same way. The token
// is checked as WriteRow checks it: for a resource a guard binds to a
// lease or semaphore, and for any resource when req.Lease is set, the lease
// (req.Lease, default the lease the binding names) must be held with
// req.Token by the database clock, and its row stays
// locked FOR KEY SHARE until tx ends, so no takeover lands before tx
// commits (the holder's own renewals do not wait). A resource no guard
// binds (GuardTable never attached one) with req.Lease empty is checked
// against its highest token seen alone, as a plain fencing-token store
// (Kleppmann 2016): a released or expired lease's token that is still the
// highest is admitted there, so name the lease in req.Lease to have it
// checked. Then the resource's highest token seen is
// raised to req.Token, a row that stays locked until tx ends, so the
// guarded statements cannot interleave with another writer's. Presenting
// several resources in one transaction is allowed; present them in the
// same order everywhere, or two transactions may deadlock (40P01). The
// token lives in a transaction-scoped setting (pgquota.fence_tokens) with a
// keyed hash over resource, token, lease and the transaction's id that only
// pgquota.present_token computes, so a token set there by hand or copied
// from another transaction is refused (PQ003); it is safe behind a
// transaction-mode pooler and gone after commit or rollback; a savepoint
// rolled back takes a presentation made inside it away.
//
// RunTx does the whole sequence (begin, present, run, commit) in one
// call.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) for a bad resource, token or lease
// name, nothing sent; *StaleTokenError (ErrStaleToken, SQLSTATE PQ001) when
// the token is below the highest seen for the resource or below the token
// the lease was acquired with since; lease.ErrLost (PQ002) when the lease is
// not held with the token (expired, released, or a token it never issued,
// such as one above every token issued); ErrWrongLease (PQ004) when the
// resource is bound to another lease or semaphore than req.Lease names (or
// to external tokens and req.Lease is set); quota.ErrSchemaMissing when the schema
// predates pgquota.present_token; database errors. Every rejection aborts
// tx, as any failed statement does, so nothing of it commits.
func (c *Client) PresentTokenTx(ctx context.Context, tx pgx.Tx, req PresentTokenRequest) error {
	if err := checkPresentToken(req); err != nil {
		return err
	}
	var lease pgtype.Text
	if req.Lease != "" {
		lease = pgtype.Text{String: req.Lease, Valid: true}
	}
	_, err := c.core.Queries.FencePresentToken(ctx, tx, db.FencePresentTokenParams{Resource: req.Resource, Token: req.Token, Lease: lease})
	if err != nil {
		return fenceDBError("present fencing token", err)
	}
	return nil
}

// quoteLiteral quotes s as an SQL escape string literal (E'...'), which
// means the same whatever standard_conforming_strings says; s holds no NUL
// (checkName).
func quoteLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, "'", "''").Replace(s) + "'"
}

// refuseCitusShardedTable refuses, on a Citus coordinator, a table whose
// rows live in shards on the workers (a distributed or a reference
// table): the guard is a trigger that reads the token the transaction
// presented, a setting of the coordinator's session that a trigger on a
// worker's shard cannot see, and Citus refuses triggers on such tables
// unless citus.enable_unsafe_triggers is on. A plain table or a Citus
// local table on the coordinator is guarded as on plain PostgreSQL.
func refuseCitusShardedTable(ctx context.Context, tx pgx.Tx, table, resource string) error {
	var citus bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return core.DBError("attach fence guard", err)
	}
	if !citus {
		return nil
	}
	var kind string
	err := tx.QueryRow(ctx, `SELECT CASE WHEN p.partmethod = 'h' THEN 'distributed' WHEN p.repmodel = 't' THEN 'reference' ELSE '' END
		FROM pg_dist_partition p WHERE p.logicalrelid = to_regclass($1)`, table).Scan(&kind)
	if err != nil && !core.IsNoRows(err) {
		return core.DBError("attach fence guard", err)
	}
	if kind == "" {
		return nil
	}
	return core.Invalid("table", "%s is a Citus %s table: the fence guard is a trigger that must run on the coordinator, "+
		"where the transaction presents its token (a trigger on a worker's shard cannot see it); keep the guarded table "+
		"on the coordinator (a plain table or a Citus local table), or fence its rows with WriteRow", resource, kind)
}
