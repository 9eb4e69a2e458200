package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgquota/pgquota/db"
	"github.com/pgquota/pgquota/migrations"
)

// Config holds a Client's settings. The zero value (or a nil *Config) is
// ready to use.
type Config struct {
	// CodeClaimWait bounds how long ClaimCode keeps trying while unclaimed
	// codes exist but every one of them is locked by another claimer that
	// has not committed yet (it may still roll back, so the campaign is not
	// sold out). The caller's context bounds it too. Defaults to 5s.
	CodeClaimWait time.Duration
}

// Client runs pgquota's operations on a connection pool. It is safe for
// concurrent use by many goroutines.
//
// Every state-changing call X has a twin XTx that runs inside the caller's
// pgx.Tx, so the caller's own writes and pgquota's commit or roll back
// together.
//
// Calls on the pool run again after a serialization failure or a deadlock
// (SQLSTATE 40001, 40P01), which pgquota's statements meet only when the
// default isolation is stricter than READ COMMITTED (a role or database
// setting, PGOPTIONS); the XTx calls return them unchanged.
type Client struct {
	pool    *pgxpool.Pool
	queries *db.Queries
	cfg     Config

	notifier leaseNotifier // AcquireWait's shared LISTEN connection (lease.go)

	// testHookFencedGrantPause, set by tests only, runs in GrantFenced
	// between the read and the fenced write.
	testHookFencedGrantPause func(context.Context, Lease)
}

// New returns a Client on pool. cfg may be nil. It does not touch the
// database; call Migrate (or run `pgquota migrate up`) once, and CheckSchema
// when you want to fail fast on a schema that is behind.
//
// The pool works behind a transaction-mode pooler (PgBouncer and the like):
// pgquota keeps no session state and takes no session-level advisory locks.
// With PgBouncer before 1.21 set pgx's default_query_exec_mode to exec or
// simple_protocol, since pgx otherwise caches prepared statements per
// connection.
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, inputError("pool", "must not be nil")
	}
	c := &Client{pool: pool, queries: db.New()}
	if cfg != nil {
		c.cfg = *cfg
	}
	if c.cfg.CodeClaimWait < 0 {
		return nil, inputError("Config.CodeClaimWait", "must not be negative, got %s", c.cfg.CodeClaimWait)
	}
	if c.cfg.CodeClaimWait == 0 {
		c.cfg.CodeClaimWait = 5 * time.Second
	}
	return c, nil
}

// Pool returns the pool the client was created with.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// Migrate applies every pending pgquota migration (goose, embedded in the
// binary; see package migrations). Replicas that call it at once wait for
// each other, and each migration is applied exactly once.
func (c *Client) Migrate(ctx context.Context) error {
	sqlDB := stdlib.OpenDBFromPool(c.pool)
	defer sqlDB.Close()
	_, err := migrations.Up(ctx, sqlDB)
	return err
}

// CheckSchema returns nil when the database's pgquota schema is at the
// version this build needs, and a *SchemaVersionError otherwise (wrapping
// ErrSchemaMissing when the schema is missing or behind). Other errors come
// from the database.
func (c *Client) CheckSchema(ctx context.Context) error {
	var have int64
	err := c.pool.QueryRow(ctx, `
		SELECT coalesce(max(version_id), 0) FROM `+migrations.VersionTable+` WHERE is_applied`).Scan(&have)
	if err != nil {
		if migrations.IsUndefinedSchemaError(err) {
			have = 0
		} else {
			return fmt.Errorf("pgquota: read schema version: %w", err)
		}
	}
	want := migrations.Latest()
	if have != want {
		return &SchemaVersionError{Have: have, Want: want}
	}
	return nil
}

// dbError wraps a database error from operation op. A missing table,
// column or function means the schema is missing or behind: the error then
// also wraps ErrSchemaMissing. The original error (a *pgconn.PgError, say)
// always stays in the chain.
func dbError(op string, err error) error {
	if migrations.IsUndefinedSchemaError(err) {
		return fmt.Errorf("pgquota: %s: %w: %w", op, ErrSchemaMissing, err)
	}
	return fmt.Errorf("pgquota: %s: %w", op, err)
}

// isNoRows reports whether err is pgx's "no rows in result set".
func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// timeFromPG converts a database timestamp to a time.Time. Infinite and NULL
// timestamps (the bounds of a lifetime window) become the zero time.
func timeFromPG(ts pgtype.Timestamptz) time.Time {
	if !ts.Valid || ts.InfinityModifier != pgtype.Finite {
		return time.Time{}
	}
	return ts.Time
}

// sqlState returns the SQLSTATE of a PostgreSQL error in err's chain, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// retryable reports a serialization failure (SQLSTATE 40001) or a deadlock
// (40P01): the transaction was rolled back, and running it again is safe.
func retryable(err error) bool {
	switch sqlState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// maxTries bounds how often onPool runs an operation.
const maxTries = 50

// onPool runs op, an operation in a transaction pgquota owns on the pool
// (one statement in its own implicit transaction, or a transaction pgquota
// begins and commits), again after a serialization failure or a deadlock,
// with jittered exponential backoff, up to maxTries times or until ctx ends
// (DESIGN.md section 4). Under READ COMMITTED pgquota's statements get
// neither; with a stricter default isolation (a role or database setting,
// PGOPTIONS) concurrent calls on one row do. A failed attempt wrote
// nothing. Inside the caller's transaction (the XTx calls) these errors are
// returned unchanged: only the caller can run its transaction again.
func onPool[T any](ctx context.Context, op func() (T, error)) (T, error) {
	wait := time.Millisecond
	for try := 1; ; try++ {
		v, err := op()
		if err == nil || !retryable(err) || try == maxTries {
			return v, err
		}
		t := time.NewTimer(jitter(wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// isForeignKeyViolation reports SQLSTATE 23503: a row referred to a quota
// or campaign that does not exist.
func isForeignKeyViolation(err error) bool { return sqlState(err) == "23503" }
