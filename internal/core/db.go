package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgquota/pgquota/internal/errtext"
	"github.com/pgquota/pgquota/migrations"
)

// ReapBatch is the number of rows one reaping statement deletes.
const ReapBatch = 5000

// Reap runs one batch deletion until it deletes less than a full batch.
func Reap(ctx context.Context, batch func() (int64, error), op string) (int64, error) {
	var total int64
	for {
		n, err := batch()
		if err != nil {
			return total, DBError(op, err)
		}
		total += n
		if n < ReapBatch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// DBError wraps a database error from operation op. A missing table,
// column or function means the schema is missing or behind: the error then
// also wraps ErrSchemaMissing. The original error (a *pgconn.PgError, say)
// always stays in the chain.
func DBError(op string, err error) error {
	if SQLState(err) == "42501" {
		return Errorf("pgquota: %s: %w: %s: %w", op, ErrPermissionDenied, permissionAdvice(err), err)
	}
	if migrations.IsUndefinedSchemaError(err) {
		return Errorf("pgquota: %s: %w: %w", op, ErrSchemaMissing, err)
	}
	if SQLState(err) == SQLStateQuotaNotFound {
		return Errorf("pgquota: %s: %w: %w", op, ErrQuotaNotFound, err)
	}
	if SQLState(err) == migrations.SQLStateCitusWorker {
		return Errorf("pgquota: %s: %w", op, migrationsCitusWorker{err})
	}
	return Errorf("pgquota: %s: %w", op, err)
}

// permissionAdvice says, for a permission error (42501), which privileges
// pgquota needs on the object PostgreSQL names, which of pgquota's roles
// holds them and how to grant that role (the one place a 42501 becomes
// advice: the CLI prints it as it is).
func permissionAdvice(err error) string {
	var pgErr *pgconn.PgError
	errors.As(err, &pgErr)
	kind, name, _ := strings.Cut(strings.TrimPrefix(pgErr.Message, "permission denied for "), " ")
	need := map[string]string{
		"table":    "SELECT",
		"view":     "SELECT",
		"schema":   "USAGE",
		"function": "EXECUTE",
	}[kind]
	if need == "" {
		return fmt.Sprintf("the role lacks a privilege pgquota's calls need (%s); as the owner of schema %s run "+
			"pgquota migrate grant-app --role ROLE (membership in %s)", pgErr.Message, migrations.Schema, migrations.AppRole)
	}
	obj := name
	if kind != "schema" && !strings.Contains(name, ".") {
		obj = migrations.Schema + "." + name
	}
	role, command := migrations.AppRole, "grant-app"
	if kind == "function" {
		switch roleOfFunction[strings.TrimPrefix(name, migrations.Schema+".")] {
		case migrations.OperatorRole:
			return fmt.Sprintf("%s is an operator command: it needs role %s (EXECUTE on function %s); "+
				"as the owner of schema %s run pgquota migrate grant-operator --role ROLE, or run it as a member of %s",
				name, migrations.OperatorRole, obj, migrations.Schema, migrations.OperatorRole)
		case migrations.RelayRole:
			role, command = migrations.RelayRole, "grant-relay"
		}
	}
	return fmt.Sprintf("the role lacks %s on %s %s, which pgquota's calls need; as the owner of schema %s run "+
		"pgquota migrate %s --role ROLE (membership in %s)",
		need, kind, obj, migrations.Schema, command, role)
}

// roleOfFunction names the role of each function (migrations/00022's
// pgquota.function_grant) that is not the application's.
var roleOfFunction = map[string]string{
	"quota_define": migrations.OperatorRole, "quota_shape_define": migrations.OperatorRole,
	"quota_override_set": migrations.OperatorRole, "quota_override_delete": migrations.OperatorRole,
	"voucher_pool_create": migrations.OperatorRole, "voucher_pool_add_codes": migrations.OperatorRole,
	"voucher_shard_create": migrations.OperatorRole, "voucher_import_codes": migrations.OperatorRole,
	"ledger_reap": migrations.OperatorRole, "lease_reap": migrations.OperatorRole,
	"lease_epoch_bump": migrations.OperatorRole, "fence_guard_register": migrations.OperatorRole,
	"lease_epoch_prepare": migrations.OperatorRole, "lease_epoch_raise": migrations.OperatorRole,
	"lease_epoch_standbys":  migrations.OperatorRole,
	"fence_guard_presented": migrations.OperatorRole, "fence_guard": migrations.OperatorRole,
	"outbox_claim": migrations.RelayRole, "outbox_mark_delivered": migrations.RelayRole,
	"outbox_mark_failed": migrations.RelayRole, "outbox_reap": migrations.RelayRole,
}

// TimeFromPG converts a database timestamp to a time.Time. Infinite and NULL
// timestamps (the bounds of a lifetime window) become the zero time.
func TimeFromPG(ts pgtype.Timestamptz) time.Time {
	if !ts.Valid || ts.InfinityModifier != pgtype.Finite {
		return time.Time{}
	}
	return ts.Time
}

// SQLState returns the SQLSTATE of a PostgreSQL error in err's chain, or "".
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// MaxNameBytes is the longest quota name, member, campaign or voucher code
// accepted, in bytes of UTF-8.
const MaxNameBytes = 255

// MaxUnits is the largest amount, limit or pool total accepted: 2^62 - 1.
// With both an amount and a counter at most MaxUnits, their sum (at most
// 2^63 - 2) never overflows PostgreSQL's bigint (at most 2^63 - 1).
const MaxUnits int64 = 1<<62 - 1

// CheckName validates an identifier-like argument: a quota name, member,
// campaign or code. It must be non-empty, at most MaxNameBytes bytes of valid
// UTF-8, and free of control characters (NUL included: PostgreSQL text
// cannot hold it).
func CheckName(field, v string) error {
	switch {
	case v == "":
		return Invalid(field, "must not be empty")
	case len(v) > MaxNameBytes:
		return Invalid(field, "is %d bytes long, the limit is %d", len(v), MaxNameBytes)
	case !utf8.ValidString(v):
		return Invalid(field, "is not valid UTF-8")
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return Invalid(field, "must not contain control characters (found %U)", r)
		}
	}
	return nil
}

// CheckUnits validates a count of units: an amount (min 1), a limit (min 0)
// or a pool total (min 1).
func CheckUnits(field string, v, min int64) error {
	switch {
	case v < min:
		return Invalid(field, "must be at least %d, got %d", min, v)
	case v > MaxUnits:
		return Invalid(field, "must be at most %d, got %d", MaxUnits, v)
	}
	return nil
}

// Errorf is fmt.Errorf whose message carries one "pgquota: " prefix however
// many of the wrapped errors start with one (errtext.Errorf).
var Errorf = errtext.Errorf

// SQLStateQuotaNotFound is the SQLSTATE pgquota's SQL functions raise for a
// quota that does not exist (quota.SQLStateQuotaNotFound documents it).
const SQLStateQuotaNotFound = "PQ010"

// IsNoRows reports whether err is pgx's "no rows in result set".
func IsNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// CheckToken checks a fencing token argument: positive.
func CheckToken(token int64) error {
	if token < 1 {
		return Invalid("token", "must be positive, got %d", token)
	}
	return nil
}

// MaxSemaphoreNameBytes is the longest semaphore name accepted, in bytes of
// UTF-8 (lease.MaxSemaphoreNameBytes documents it).
const MaxSemaphoreNameBytes = 240

// CheckSemaphoreName checks a semaphore name: a name (CheckName) of at most
// MaxSemaphoreNameBytes bytes.
func CheckSemaphoreName(name string) error {
	if err := CheckName("semaphore", name); err != nil {
		return err
	}
	if len(name) > MaxSemaphoreNameBytes {
		return Invalid("semaphore", "is %d bytes long, the limit is %d", len(name), MaxSemaphoreNameBytes)
	}
	return nil
}

// Bounds of a lease's TTL (lease.MinTTL and lease.MaxTTL document them).
const (
	MinLeaseTTL = time.Millisecond
	MaxLeaseTTL = 24 * time.Hour
)

// CheckTTL checks a lease TTL: within MinLeaseTTL..MaxLeaseTTL.
func CheckTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return Invalid("ttl", "must be positive, got %s", ttl)
	case ttl < MinLeaseTTL:
		return Invalid("ttl", "must be at least %s, got %s (a unit mistake?)", MinLeaseTTL, ttl)
	case ttl > MaxLeaseTTL:
		return Invalid("ttl", "must be at most %s, got %s", MaxLeaseTTL, ttl)
	}
	return nil
}

// WaitMS is a wait in whole milliseconds, rounded up, so that a client
// sleeping it never retries early; a negative wait (quota.Never: no wait
// helps) is -1. The library's JSON (quota/json.go) and the CLI's --json
// print waits with it.
func WaitMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// migrationsCitusWorker is the server's SQLStateCitusWorker error (its
// message says which call and why) that also unwraps to
// migrations.ErrCitusWorker.
type migrationsCitusWorker struct{ err error }

func (e migrationsCitusWorker) Error() string   { return e.err.Error() }
func (e migrationsCitusWorker) Unwrap() []error { return []error{migrations.ErrCitusWorker, e.err} }
