// Package leasebench measures the fenced lock's two hot statements, an
// acquire of a free lease and a fenced write by the current holder, through
// the library and through pgbench running the same SQL, so that the
// library's overhead over the raw statement can be read as a ratio.
//
// Both sides run one statement per operation (one round trip), with
// prepared statements (pgx's default statement cache; pgbench -M
// prepared), one connection per client. The pgbench scripts
// (acquire.pgbench, fence_write.pgbench) hold the library's SQL text
// without its comments; TestPgbenchScriptsMatchLibrary fails when they
// drift from what the library sends.
//
// Run the comparison (8 and 32 clients, each side measured 3 times for the
// given duration, alternating; medians are printed):
//
//	PGQUOTA_LEASE_BENCH=10s go test -run TestCompareWithPgbench -v -timeout 30m ./internal/leasebench/
//
// and the Go benchmarks alone:
//
//	go test -run '^$' -bench . ./internal/leasebench/
package leasebench

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HolderTokenBase is the token of client i's lease in the fenced-write
// benchmark: HolderTokenBase + i.
const HolderTokenBase = 1_000_000

// SetupHolders creates one lease per client, named by the client's number
// ("0", "1", ...), held for an hour with token HolderTokenBase + i, and
// moves the token sequence past them. pgbench's :client_id numbers its
// clients the same way.
func SetupHolders(ctx context.Context, pool *pgxpool.Pool, clients int) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO pgquota.lease (name, holder, attempt, token, acquired_at, renewed_at, expires_at)
		SELECT i::text, 'bench', 'bench-' || i, $1 + i, clock_timestamp(), clock_timestamp(), clock_timestamp() + interval '1 hour'
		FROM generate_series(0, $2 - 1) i
		ON CONFLICT (name) DO UPDATE
		SET token = excluded.token, expires_at = excluded.expires_at, attempt = excluded.attempt;
		`, HolderTokenBase, clients)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `SELECT setval('pgquota.lease_token', greatest($1::bigint, (SELECT last_value FROM pgquota.lease_token)))`,
		int64(HolderTokenBase)*2)
	return err
}

// Recorder is a pgx.QueryTracer that records the SQL text of every query.
type Recorder struct {
	mu  sync.Mutex
	SQL []string
}

// TraceQueryStart records data.SQL.
func (r *Recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.SQL = append(r.SQL, data.SQL)
	return ctx
}

// TraceQueryEnd does nothing.
func (r *Recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Take returns the recorded queries and forgets them.
func (r *Recorder) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.SQL
	r.SQL = nil
	return out
}

var placeholder = regexp.MustCompile(`\$([0-9]+)`)

// PgbenchScript turns one of the library's statements into a pgbench
// script: comment lines are dropped (pgbench would read ":name" inside
// them as a variable), $n becomes :vars[n-1], and the meta-commands in
// header come first.
func PgbenchScript(sql string, vars []string, header string) (string, error) {
	var lines []string
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		lines = append(lines, line)
	}
	var bad error
	body := placeholder.ReplaceAllStringFunc(strings.Join(lines, "\n"), func(m string) string {
		var n int
		fmt.Sscan(m[1:], &n)
		if n < 1 || n > len(vars) {
			bad = fmt.Errorf("placeholder %s has no variable", m)
			return m
		}
		return ":" + vars[n-1]
	})
	if bad != nil {
		return "", bad
	}
	return header + strings.TrimSpace(body) + ";\n", nil
}
