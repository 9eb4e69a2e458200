package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// schemaSnapshotQuery lists, one line each, every object of a schema with
// what defines it, so that two databases migrated the same way give the
// same lines: relations (tables, views, sequences, indexes) with their
// columns, defaults, identity, constraints and index definitions,
// sequences' parameters and owning column, functions with a hash of their
// body, and the privileges on all of them (including the schema's default
// privileges). OIDs never appear, so databases can be compared.
const schemaSnapshotQuery = `
WITH ns AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = $1)
SELECT 'schema ' || ns.nspname || ' acl=' || coalesce(n.nspacl::text, '') FROM ns JOIN pg_namespace n ON n.oid = ns.oid
UNION ALL
SELECT 'relation ' || c.relkind::text || ' ' || c.relname || ' acl=' || coalesce(c.relacl::text, '')
FROM pg_class c JOIN ns ON ns.oid = c.relnamespace
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN ns ON ns.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm')
UNION ALL
SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN ns ON ns.oid = c.relnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN ns ON ns.oid = c.relnamespace
UNION ALL
SELECT 'sequence ' || c.relname || ' ' || format_type(s.seqtypid, NULL) || ' start ' || s.seqstart::text
       || ' min ' || s.seqmin::text || ' max ' || s.seqmax::text || ' cycle ' || s.seqcycle::text
       || coalesce(' owned by ' || oc.relname || '.' || oa.attname || ' (' || dep.deptype::text || ')', '')
FROM pg_sequence s
JOIN pg_class c ON c.oid = s.seqrelid
JOIN ns ON ns.oid = c.relnamespace
LEFT JOIN pg_depend dep ON dep.classid = 'pg_class'::regclass AND dep.objid = c.oid
     AND dep.refclassid = 'pg_class'::regclass AND dep.deptype IN ('a', 'i')
LEFT JOIN pg_class oc ON oc.oid = dep.refobjid
LEFT JOIN pg_attribute oa ON oa.attrelid = dep.refobjid AND oa.attnum = dep.refobjsubid
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') returns '
       || pg_get_function_result(p.oid) || ' ' || p.provolatile::text || ' body ' || md5(p.prosrc)
       || ' acl=' || coalesce(p.proacl::text, '')
FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace
UNION ALL
SELECT 'type ' || t.typname || ' ' || t.typtype::text
FROM pg_type t JOIN ns ON ns.oid = t.typnamespace
UNION ALL
SELECT 'default privileges ' || pg_get_userbyid(da.defaclrole) || ' ' || da.defaclobjtype::text || ' ' || da.defaclacl::text
FROM pg_default_acl da JOIN ns ON ns.oid = da.defaclnamespace
ORDER BY 1`

// SchemaSnapshot returns the lines of schemaSnapshotQuery for schema on
// pool's database, sorted: two databases whose schemas were built the same
// way give equal snapshots.
func SchemaSnapshot(tb testing.TB, pool *pgxpool.Pool, schema string) []string {
	tb.Helper()
	rows, err := pool.Query(context.Background(), schemaSnapshotQuery, schema)
	if err != nil {
		tb.Fatalf("pgtest: schema snapshot: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			tb.Fatalf("pgtest: schema snapshot: %v", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("pgtest: schema snapshot: %v", err)
	}
	return out
}
