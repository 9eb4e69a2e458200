package migrations

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

// UpPool is Up for a *pgxpool.Pool, the handle quota.New takes: it runs Up
// on a database/sql handle over pool (stdlib.OpenDBFromPool, closed when
// it returns; pool stays open) and needs one of pool's connections, on a
// direct connection or a session-mode pooler (the migration lock is a
// session-level advisory lock). quota.Client.Migrate calls it.
//
// Errors: those of Up.
func UpPool(ctx context.Context, pool *pgxpool.Pool, opts ...Option) ([]*goose.MigrationResult, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return Up(ctx, db, opts...)
}
