// Package sqltest proves pgquota's public SQL interface (docs/sql.md) from
// outside Go: scripts run by psql (testdata/*.sql, each on a freshly
// migrated database, failing by RAISE EXCEPTION) and concurrent grants
// raced by pgbench. It holds tests only.
package sqltest
