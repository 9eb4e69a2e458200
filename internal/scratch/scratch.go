// Package scratch creates throwaway databases on a target server for
// `pgquota lab` and `pgquota bench`, so that neither ever touches a user's
// data: each run gets a database of its own, migrated to pgquota's schema,
// and drops it afterwards.
package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgquota/pgquota/migrations"
)

// dropTimeout bounds the DROP DATABASE that ends a scratch database's life,
// also when the caller's context is already cancelled.
const dropTimeout = 30 * time.Second

// Database is a scratch database on the target server.
type Database struct {
	// Name is the database's name: the prefix given to Create and a random
	// suffix.
	Name string

	admin *pgxpool.Pool
	cfg   *pgxpool.Config
}

// Create creates an empty database named prefix_<random> on the server that
// admin is connected to, and migrates it to pgquota's schema. admin stays
// in use until Drop. The role needs the CREATEDB privilege.
func Create(ctx context.Context, admin *pgxpool.Pool, prefix string) (*Database, error) {
	var suffix [5]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, err
	}
	name := prefix + "_" + hex.EncodeToString(suffix[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return nil, fmt.Errorf("create scratch database %s: the role needs the CREATEDB privilege (the database is dropped afterwards): %w", name, err)
		}
		return nil, fmt.Errorf("create scratch database %s: %w", name, err)
	}
	cfg := admin.Config()
	cfg.ConnConfig.Database = name
	d := &Database{Name: name, admin: admin, cfg: cfg}
	if err := d.migrate(ctx); err != nil {
		return nil, errors.Join(err, d.Drop(ctx))
	}
	return d, nil
}

func (d *Database) migrate(ctx context.Context) error {
	pool, err := d.Pool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	if _, err := migrations.Up(ctx, sqlDB); err != nil {
		return fmt.Errorf("migrate scratch database %s: %w", d.Name, err)
	}
	return nil
}

// Config returns a copy of the connection settings for the scratch
// database, with MaxConns set to maxConns and the pool's hooks cleared.
func (d *Database) Config(maxConns int32) *pgxpool.Config {
	cfg := d.cfg.Copy()
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	return cfg
}

// Pool opens a pool of at most maxConns connections on the scratch
// database.
func (d *Database) Pool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, d.Config(maxConns))
	if err != nil {
		return nil, fmt.Errorf("connect to scratch database %s: %w", d.Name, err)
	}
	return pool, nil
}

// Drop removes the scratch database, ending any session still connected
// to it. It runs under context.WithoutCancel with a timeout, so a cancelled
// run (Ctrl-C) still cleans up.
func (d *Database) Drop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropTimeout)
	defer cancel()
	_, err := d.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("drop scratch database %s: %w", d.Name, err)
	}
	return nil
}
