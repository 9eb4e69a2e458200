// Package scratch creates throwaway databases on a target server for
// `pgquota lab` and `pgquota bench`, so that neither ever touches a user's
// data: each run gets a database of its own, migrated to pgquota's schema,
// and drops it afterwards.
//
// On a Citus coordinator (the target database has the citus extension),
// the scratch database is a Citus database of its own: Citus 13 does not
// propagate CREATE DATABASE, so Create creates it on the coordinator and
// on every active primary worker that pg_dist_node lists (connecting to
// each with the target's user, password and database, at the node's host
// and port), creates the extension in each, registers the coordinator and
// the workers, and migrates it, which distributes pgquota's tables there
// as on the target (migrations.Up). Drop drops it on every node.
package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
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
	// workers are the Citus workers the database was also created on
	// (none on a plain server).
	workers []*pgx.ConnConfig
}

// node is a Citus node as pg_dist_node lists it.
type node struct {
	host        string
	port        int
	coordinator bool
}

// citusNodes returns the active primary nodes of the Citus cluster admin
// is connected to (the coordinator, when registered, first), or nil when
// admin's database has no citus extension.
func citusNodes(ctx context.Context, admin *pgxpool.Pool) ([]node, error) {
	var has bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&has); err != nil {
		return nil, fmt.Errorf("look for the citus extension: %w", err)
	}
	if !has {
		return nil, nil
	}
	rows, err := admin.Query(ctx, `SELECT nodename, nodeport, groupid = 0 FROM pg_dist_node
		WHERE isactive AND noderole = 'primary' ORDER BY groupid, nodeid`)
	if err != nil {
		return nil, fmt.Errorf("list the Citus nodes (pg_dist_node): %w", err)
	}
	nodes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (node, error) {
		var n node
		err := r.Scan(&n.host, &n.port, &n.coordinator)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the Citus nodes (pg_dist_node): %w", err)
	}
	return nodes, nil
}

// on returns a copy of cfg's connection settings for database on host and
// port.
func on(cfg *pgx.ConnConfig, host string, port int, database string) *pgx.ConnConfig {
	c := cfg.Copy()
	c.Host, c.Port, c.Database = host, uint16(port), database
	c.Fallbacks = nil
	return c
}

// execOn runs statements, one after another, in a connection of its own
// made with cfg.
func execOn(ctx context.Context, cfg *pgx.ConnConfig, statements ...string) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, stmt := range statements {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
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
	if err := d.citus(ctx); err != nil {
		return nil, errors.Join(err, d.Drop(ctx))
	}
	if err := d.migrate(ctx); err != nil {
		return nil, errors.Join(err, d.Drop(ctx))
	}
	return d, nil
}

// citus makes d a Citus database of its own when the admin's database is
// on a Citus coordinator: the database and the extension on every worker,
// then the extension on the coordinator and every node registered.
func (d *Database) citus(ctx context.Context) error {
	nodes, err := citusNodes(ctx, d.admin)
	if err != nil || nodes == nil {
		return err
	}
	target := d.admin.Config().ConnConfig
	coordinator := []string{"CREATE EXTENSION citus"}
	for _, n := range nodes {
		if n.coordinator {
			coordinator = append(coordinator, fmt.Sprintf("SELECT citus_set_coordinator_host(%s, %d)", quoteLiteral(n.host), n.port))
			continue
		}
		// Recorded before the CREATE DATABASE, so that Drop tries it
		// wherever the create may have got.
		d.workers = append(d.workers, on(target, n.host, n.port, target.Database))
		if err := execOn(ctx, d.workers[len(d.workers)-1], "CREATE DATABASE "+pgx.Identifier{d.Name}.Sanitize()); err != nil {
			return fmt.Errorf("create scratch database %s on Citus worker %s:%d: %w", d.Name, n.host, n.port, err)
		}
		if err := execOn(ctx, on(target, n.host, n.port, d.Name), "CREATE EXTENSION citus"); err != nil {
			return fmt.Errorf("scratch database %s on Citus worker %s:%d: %w", d.Name, n.host, n.port, err)
		}
		coordinator = append(coordinator, fmt.Sprintf("SELECT citus_add_node(%s, %d)", quoteLiteral(n.host), n.port))
	}
	if err := execOn(ctx, d.cfg.ConnConfig, coordinator...); err != nil {
		return fmt.Errorf("scratch database %s on the Citus coordinator: %w", d.Name, err)
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
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
	drop := "DROP DATABASE IF EXISTS " + pgx.Identifier{d.Name}.Sanitize() + " WITH (FORCE)"
	var errs []error
	if _, err := d.admin.Exec(ctx, drop); err != nil {
		errs = append(errs, fmt.Errorf("drop scratch database %s: %w", d.Name, err))
	}
	for _, w := range d.workers {
		if err := execOn(ctx, w, drop); err != nil {
			errs = append(errs, fmt.Errorf("drop scratch database %s on Citus worker %s:%d: %w", d.Name, w.Host, w.Port, err))
		}
	}
	return errors.Join(errs...)
}
