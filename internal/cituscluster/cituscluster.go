// Package cituscluster runs a throwaway Citus cluster for tests: a
// coordinator and N workers, each a pgcluster server (initdb in a temporary
// folder, postgres on a free port of 127.0.0.1, run as the OS user postgres
// when the test runs as root, stopped by process id in tb.Cleanup, the tail
// of its log printed when the test failed).
//
// Every node preloads citus (shared_preload_libraries) and has database
// Database with the citus extension. The coordinator is registered as such
// (citus_set_coordinator_host) and every worker is added to it
// (citus_add_node); AddWorker adds one more while the test runs.
//
// Citus is not in Debian's packages: .ci/citus-build builds it from the
// vendored source and installs citus.so into the PostgreSQL whose binaries
// pgcluster runs. Without it Start fails the test saying so; it never
// skips. The tests that start a cluster build with the tag citus (`go test
// -tags citus`), in CI's Citus pass: `make test` runs on an ordinary server.
package cituscluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/internal/pgcluster"
)

// Database is the database that every node has, with the citus extension
// created in it. Citus connects to a worker's database of the same name.
const Database = "pgquota"

// Cluster is a Citus coordinator and its workers.
type Cluster struct {
	tb   testing.TB
	opts pgcluster.Options

	// Coordinator is the node that the tests connect to.
	Coordinator *pgcluster.Cluster

	mu      sync.Mutex
	workers []*pgcluster.Cluster
	pool    *pgxpool.Pool
}

// settings are the postgresql.conf lines of every node, over pgcluster's.
func settings(opts pgcluster.Options) pgcluster.Options {
	s := pgcluster.Options{
		"shared_preload_libraries": "'citus'",
		// A modification of shards on more than one node commits with
		// two-phase commit on the workers.
		"max_prepared_transactions": "60",
		"max_connections":           "60",
		// Shard moves (a rebalance) copy through logical replication.
		"wal_level":             "logical",
		"max_wal_senders":       "10",
		"max_replication_slots": "10",
		"max_worker_processes":  "16",
		// The nodes listen on 127.0.0.1 only: Citus's own connections
		// between them go without TLS (its default is sslmode=require).
		"citus.node_conninfo": "'sslmode=disable'",
	}
	for k, v := range opts {
		s[k] = v
	}
	return s
}

// Start starts a coordinator and workers workers, and adds the workers to
// the coordinator. Everything stops in tb.Cleanup.
func Start(tb testing.TB, workers int) *Cluster {
	tb.Helper()
	return StartWith(tb, workers, nil)
}

// StartWith is Start with more postgresql.conf settings for every node
// (for example citus.shard_count or citus.enable_unsafe_triggers).
func StartWith(tb testing.TB, workers int, opts pgcluster.Options) *Cluster {
	tb.Helper()
	RequireCitus(tb)
	c := &Cluster{tb: tb, opts: opts}
	c.Coordinator = c.newNode("citus-coordinator")
	c.Coordinator.Exec(Database, fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", c.Coordinator.Port))
	for i := 0; i < workers; i++ {
		c.AddWorker()
	}
	return c
}

// RequireCitus fails the test when citus.so is not installed in the
// PostgreSQL that pgcluster runs.
func RequireCitus(tb testing.TB) {
	tb.Helper()
	bin, err := pgcluster.BinDir()
	if err != nil {
		tb.Fatalf("cituscluster: %v", err)
	}
	lib := libDir(bin)
	if _, err := os.Stat(filepath.Join(lib, "citus.so")); err != nil {
		tb.Fatalf("cituscluster: Citus is not installed: no citus.so in %s (the PostgreSQL of %s). "+
			"Run .ci/citus-build (as root, or with sudo): it builds Citus 13.0.5 from shared/vendor and installs it", lib, bin)
	}
}

// libDir is the folder of the server's loadable modules: pg_config
// --pkglibdir beside the binaries, else Debian's layout (bin/../lib).
func libDir(bin string) string {
	if out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" {
			return d
		}
	}
	return filepath.Join(filepath.Dir(bin), "lib")
}

// newNode starts a server with Citus preloaded and the extension created
// in Database.
func (c *Cluster) newNode(name string) *pgcluster.Cluster {
	c.tb.Helper()
	n := pgcluster.New(c.tb, name, settings(c.opts))
	n.Exec("postgres", "CREATE DATABASE "+pgx.Identifier{Database}.Sanitize())
	n.Exec(Database, "CREATE EXTENSION citus")
	return n
}

// AddWorker starts one more worker and adds it to the coordinator
// (citus_add_node). Tables distributed before keep their shards where they
// are until they are rebalanced; tables distributed afterwards get shards
// on it too.
func (c *Cluster) AddWorker() *pgcluster.Cluster {
	c.tb.Helper()
	c.mu.Lock()
	name := "citus-worker" + strconv.Itoa(len(c.workers)+1)
	c.mu.Unlock()
	w := c.newNode(name)
	c.Coordinator.Exec(Database, fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port))
	c.mu.Lock()
	c.workers = append(c.workers, w)
	c.mu.Unlock()
	return w
}

// Workers returns the workers, in the order they were added.
func (c *Cluster) Workers() []*pgcluster.Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*pgcluster.Cluster(nil), c.workers...)
}

// URL is the libpq URL of Database on the coordinator, as superuser
// postgres (or as role user when one is given).
func (c *Cluster) URL(user ...string) string {
	return c.Coordinator.URL(Database, user...)
}

// Pool returns a pgx pool on the coordinator's Database, opened at the
// first call and closed in tb.Cleanup.
func (c *Cluster) Pool() *pgxpool.Pool {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pool == nil {
		c.pool = pgcluster.Pool(c.tb, c.URL())
	}
	return c.pool
}

// Exec runs SQL statements (no parameters, several allowed) on the
// coordinator's Database as postgres.
func (c *Cluster) Exec(statements string) {
	c.tb.Helper()
	c.Coordinator.Exec(Database, statements)
}

// ActiveWorkers returns the ports of the workers the coordinator knows as
// active primaries (pg_dist_node), in ascending order.
func (c *Cluster) ActiveWorkers() []int {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := c.Pool().Query(ctx, `SELECT nodeport FROM pg_dist_node
		WHERE isactive AND noderole = 'primary' AND shouldhaveshards AND groupid <> 0 ORDER BY nodeport`)
	if err != nil {
		c.tb.Fatalf("cituscluster: pg_dist_node: %v", err)
	}
	ports, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		c.tb.Fatalf("cituscluster: pg_dist_node: %v", err)
	}
	return ports
}
