package quota

import (
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgquota/pgquota/internal/core"
)

// PoolerMode says what sits between a Client's pool and PostgreSQL, for
// Config.Pooler.
type PoolerMode string

const (
	// PoolerNone is a direct connection, or a pooler in session mode (a
	// client keeps one server connection for as long as it is connected).
	// lease.Client.AcquireWait then wakes early on a release with LISTEN.
	PoolerNone PoolerMode = ""
	// PoolerTransaction is a pooler in transaction mode (PgBouncer's
	// pool_mode = transaction, Supavisor, RDS Proxy and the like): every
	// transaction, and every statement outside one, may run on another
	// server connection, shared with other clients. Session state set by
	// one statement (LISTEN, SET, a named prepared statement, a
	// session-level advisory lock) stays on a server connection that other
	// clients use next. With it, pgquota keeps none: no LISTEN
	// (lease.Client.AcquireWait polls instead), and New
	// accepts only a pool whose pgx query exec mode sends each statement in
	// one round trip without naming a prepared statement
	// (pgx.QueryExecModeExec or pgx.QueryExecModeSimpleProtocol).
	PoolerTransaction PoolerMode = "transaction"
)

// EnvPooler is the environment variable from which the pgquota command
// reads its --pooler setting when the flag is not given: "transaction" or
// "none" (the default). The library itself reads no environment: set
// Config.Pooler.
const EnvPooler = "PGQUOTA_POOLER"

// ParsePoolerMode parses the text form of a PoolerMode: "transaction", or
// "none", "session" or "" for PoolerNone. PgBouncer's statement mode (no
// transactions of more than one statement) cannot run pgquota's
// transactions and is refused, like any other value, with an *InputError
// naming field.
func ParsePoolerMode(field, s string) (PoolerMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "none", "session":
		return PoolerNone, nil
	case "transaction":
		return PoolerTransaction, nil
	case "statement":
		return "", core.Invalid(field, "statement pooling cannot run transactions of several statements, which pgquota uses: use a pooler in transaction or session mode")
	}
	return "", core.Invalid(field, "must be none or transaction, got %q", s)
}

// CheckExecMode returns nil when pgx's query exec mode is safe behind a
// pooler of kind m, and otherwise an *InputError (ErrInvalidInput) that
// names pgx's DefaultQueryExecMode, why mode is unsafe and what to set.
//
// Behind a transaction pooler only two modes are safe: pgx.QueryExecModeExec
// (the extended protocol with the unnamed statement: parse, bind, describe
// and execute in one round trip) and pgx.QueryExecModeSimpleProtocol (one
// text query, parameters interpolated by pgx). The others are refused:
// QueryExecModeCacheStatement (pgx's default) prepares named statements on
// one server connection and runs them later on whichever the pooler picks,
// where they do not exist or are another client's (PgBouncer before 1.21
// has no prepared statement support; pgquota does not rely on it where it
// exists); QueryExecModeCacheDescribe and QueryExecModeDescribeExec
// describe a statement in one round trip and bind it in a second, so the
// pooler may run the second on another server connection, binding the
// parameters to another client's unnamed statement (SQLSTATE 08P01, or
// the wrong statement run); QueryExecModeCacheDescribe also keeps result
// types that a schema change makes stale. Any mode is safe behind
// PoolerNone.
func (m PoolerMode) CheckExecMode(mode pgx.QueryExecMode) error {
	if m != PoolerTransaction {
		return nil
	}
	var name, why string
	switch mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return nil
	case pgx.QueryExecModeCacheStatement:
		name = "pgx.QueryExecModeCacheStatement (cache_statement, pgx's default)"
		why = "it prepares named statements on one server connection and runs them on whichever the pooler picks next"
	case pgx.QueryExecModeCacheDescribe:
		name = "pgx.QueryExecModeCacheDescribe (cache_describe)"
		why = "it describes a statement and binds it in two round trips, which the pooler may send to two server connections (08P01, or another client's statement run with these parameters)"
	case pgx.QueryExecModeDescribeExec:
		name = "pgx.QueryExecModeDescribeExec (describe_exec)"
		why = "it describes a statement and binds it in two round trips, which the pooler may send to two server connections (08P01, or another client's statement run with these parameters)"
	default:
		name, why = mode.String(), "pgquota does not know it"
	}
	return core.Invalid("pool's ConnConfig.DefaultQueryExecMode",
		"is %s, which is unsafe behind a transaction pooler (Config.Pooler = %q): %s; set pgx's DefaultQueryExecMode to pgx.QueryExecModeExec (default_query_exec_mode=exec in the connection string) or pgx.QueryExecModeSimpleProtocol",
		name, PoolerTransaction, why)
}

// String returns "transaction" or "none".
func (m PoolerMode) String() string {
	if m == PoolerNone {
		return "none"
	}
	return string(m)
}

// checkPooler validates Config.Pooler for New.
func checkPooler(m PoolerMode) error {
	switch m {
	case PoolerNone, PoolerTransaction:
		return nil
	}
	return core.Invalid("Config.Pooler", "must be PoolerNone or PoolerTransaction, got %q", string(m))
}
