package cli_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
)

// writeRowsFile writes a grant --file CSV of rows rows, row i for member
// member(i), one unit each, and returns its path.
func writeRowsFile(t *testing.T, rows int, member func(i int) string) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("quota,member,amount\n")
	for i := range rows {
		fmt.Fprintf(&sb, "big,%s,1\n", member(i))
	}
	path := filepath.Join(t.TempDir(), "rows.csv")
	require.NoError(t, os.WriteFile(path, []byte(sb.String()), 0o600))
	return path
}

// usedSum returns the sum of every counter of quota big.
func usedSum(t *testing.T, dbURL string) int64 {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = 'big'`).Scan(&n))
	return n
}

// readOut reads a grant --out CSV file: its records by line, and the
// number of records per status.
func readOut(t *testing.T, path string) (map[int][]string, map[string]int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Equal(t, "line", recs[0][0])
	byLine := map[int][]string{}
	statuses := map[string]int{}
	for _, r := range recs[1:] {
		line, err := strconv.Atoi(r[0])
		require.NoError(t, err)
		if _, dup := byLine[line]; dup {
			t.Fatalf("line %d has two outcomes", line)
		}
		byLine[line] = r
		statuses[r[5]]++
	}
	return byLine, statuses
}

// Three grant --file runs of the same 3,000-row file on one counter at
// once (three replicas of a nightly job, say), the limit well above the
// total: every row of every run is granted, and the counter holds them all.
func TestGrantFileConcurrentRunsOneCounter(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	ok(t, dbURL, "quota", "define", "--name", "big", "--window", "day", "--limit", "1000000")
	const rows, runs = 3000, 3
	path := writeRowsFile(t, rows, func(int) string { return "hot" })
	results := make([]result, runs)
	outs := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		outs[i] = filepath.Join(t.TempDir(), fmt.Sprintf("out-%d.csv", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runDB(t, dbURL, "grant", "--file", path, "--out", outs[i], "--batch-size", "100", "--workers", "2")
		}()
	}
	wg.Wait()
	for i, r := range results {
		require.Equal(t, cli.ExitOK, r.code, "run %d: stderr %q", i, r.stderr)
		require.Regexp(t, fmt.Sprintf(`(?m)^granted\s+%d$`, rows), r.stdout, "run %d", i)
		_, statuses := readOut(t, outs[i])
		require.Equal(t, map[string]int{"granted": rows}, statuses, "run %d", i)
	}
	require.Equal(t, int64(rows*runs), usedSum(t, dbURL), "the counter holds every row granted")
}

// A grant --file interrupted mid-run (its context ends, as on Ctrl-C):
// it says so, --out holds every line of the file (granted or not run: the
// batches in flight still commit and report), the summary's granted rows
// are the counters' units, and it says how to resume. The resumed run
// with --skip-decided grants exactly the rest.
func TestGrantFileInterrupted(t *testing.T) {
	t.Parallel()
	dbURL := migratedURL(t)
	ok(t, dbURL, "quota", "define", "--name", "big", "--window", "day", "--limit", "1000000")
	const rows = 12_000
	path := writeRowsFile(t, rows, func(i int) string { return fmt.Sprint("m", i%1200) })
	out := filepath.Join(t.TempDir(), "out.csv")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The interrupt, once the first batches have committed.
		for usedSum(t, dbURL) == 0 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	var stdout, stderr bytes.Buffer
	code := cli.Run(ctx, []string{"--database-url", dbURL, "grant", "--file", path, "--out", out,
		"--batch-size", "300", "--workers", "2"}, &stdout, &stderr)
	require.Equal(t, cli.ExitError, code, "stderr %q", stderr.String())
	require.Regexp(t, `(?m)^interrupted\s+yes$`, stdout.String())
	require.Contains(t, stderr.String(), "grant --file interrupted after")
	require.Contains(t, stderr.String(), "--skip-decided "+out, "says how to resume without keys")
	require.NotContains(t, stderr.String(), "line ", "no row is listed as a bad row")

	byLine, statuses := readOut(t, out)
	require.Len(t, byLine, rows, "every line of the file is in --out")
	for line := 2; line < rows+2; line++ {
		if _, ok := byLine[line]; !ok {
			t.Fatalf("line %d is missing from --out", line)
		}
	}
	require.Positive(t, statuses["not_run"], "interrupted before the end")
	require.Equal(t, rows, statuses["granted"]+statuses["not_run"], "granted or not run, none unknown: %v", statuses)
	granted := int64(statuses["granted"])
	require.Regexp(t, fmt.Sprintf(`(?m)^granted\s+%d$`, granted), stdout.String())
	require.Regexp(t, fmt.Sprintf(`(?m)^not run\s+%d$`, statuses["not_run"]), stdout.String())
	require.Equal(t, granted, usedSum(t, dbURL), "the summary matches the counters")
	t.Logf("interrupted: %d granted, %d not run", granted, statuses["not_run"])

	// Resume: the decided lines are skipped, the rest granted once.
	out2 := filepath.Join(t.TempDir(), "out-2.csv")
	r := runDB(t, dbURL, "grant", "--file", path, "--skip-decided", out, "--out", out2)
	require.Equal(t, cli.ExitOK, r.code, "stderr %q", r.stderr)
	_, statuses2 := readOut(t, out2)
	require.Equal(t, map[string]int{"skipped": int(granted), "granted": rows - int(granted)}, statuses2)
	require.Regexp(t, fmt.Sprintf(`(?m)^skipped\s+%d$`, granted), r.stdout)
	require.Equal(t, int64(rows), usedSum(t, dbURL), "every row granted exactly once over the two runs")

	// --skip-decided with another file's outcomes is refused.
	other := writeRowsFile(t, rows, func(i int) string { return fmt.Sprint("x", i) })
	r = runDB(t, dbURL, "grant", "--file", other, "--skip-decided", out)
	require.Equal(t, cli.ExitError, r.code, "stderr %q", r.stderr)
	require.Contains(t, r.stderr, "not the same file")
}
