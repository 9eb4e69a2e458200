package cli

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/internal/bulk"
)

// fileOptions are grant --file's flags.
type fileOptions struct {
	path, out, format, skipDecided string
	batchSize, workers             int
}

// maxBadLines is how many bad rows grant --file lists on stderr; the rest
// are counted (and all are in --out).
const maxBadLines = 20

// fileSummary is grant --file's result, as --json prints it.
type fileSummary struct {
	bulk.Summary
	ElapsedMS int64  `json:"elapsed_ms"`
	File      string `json:"file"`
	Out       string `json:"out"`
}

func (a *app) grantFile(cmd *cobra.Command, opts fileOptions) error {
	ctx := cmd.Context()
	if opts.batchSize < 1 {
		return usagef("--batch-size must be at least 1, got %d", opts.batchSize)
	}
	if opts.workers < 1 || opts.workers > 64 {
		return usagef("--workers must be between 1 and 64, got %d", opts.workers)
	}
	format := opts.format
	switch {
	case format == "" && (strings.HasSuffix(opts.out, ".jsonl") || strings.HasSuffix(opts.out, ".ndjson")):
		format = "jsonl"
	case format == "" && opts.out == "-" && a.json:
		// The outcomes take stdout, which --json promises is JSON.
		format = "jsonl"
	case format == "":
		format = "csv"
	case format != "csv" && format != "jsonl":
		return usagef("--out-format must be csv or jsonl, got %q", format)
	}

	var decided map[int]bulk.Decided
	if opts.skipDecided != "" {
		if opts.skipDecided == opts.out {
			return usagef("--skip-decided and --out name the same file %s: --out would overwrite it; write the new outcomes elsewhere", opts.out)
		}
		var err error
		if decided, err = readDecided(opts.skipDecided); err != nil {
			return usagef("--skip-decided %s: %v", opts.skipDecided, err)
		}
	}

	var in io.Reader = cmd.InOrStdin()
	total := int64(-1) // rows, when known
	if opts.path != "-" {
		f, err := os.Open(opts.path)
		if err != nil {
			return usagef("--file: %v", err)
		}
		defer f.Close()
		in = f
	}
	var bar *progressbar.ProgressBar
	if w := a.progressWriter(false); w != nil {
		if opts.path != "-" {
			if n, err := countLines(opts.path); err == nil {
				total = max(n-1, 0) // the header; a quoted field spanning lines makes this an upper bound
			}
		}
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetItsString("rows"),
			progressbar.OptionShowIts(),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionFullWidth(),
			progressbar.OptionSetDescription("granting"),
		)
		defer func() { _ = bar.Clear(); fmt.Fprint(w, "\r") }()
	}
	reader, err := bulk.NewReader(bufio.NewReaderSize(in, 1<<16))
	if err != nil {
		return usagef("--file %s: %v", opts.path, err)
	}

	var out io.Writer
	if opts.out != "" {
		if opts.out == "-" {
			out = a.stdout
		} else {
			f, err := os.Create(opts.out)
			if err != nil {
				return usagef("--out: %v", err)
			}
			defer f.Close()
			out = f
		}
	}
	var write func(bulk.Outcome) error
	var finish func() error
	if out != nil {
		bw := bufio.NewWriterSize(out, 1<<16)
		finish = bw.Flush
		if format == "jsonl" {
			enc := json.NewEncoder(bw)
			write = func(o bulk.Outcome) error { return enc.Encode(o) }
		} else {
			cw := csv.NewWriter(bw)
			if err := cw.Write([]string{"line", "quota", "member", "amount", "idempotency_key", "status", "used", "limit", "remaining", "grant_id", "replayed", "error"}); err != nil {
				return err
			}
			rec := make([]string, 12)
			write = func(o bulk.Outcome) error {
				rec[0] = strconv.Itoa(o.Line)
				rec[1], rec[2] = o.Quota, o.Member
				rec[3] = strconv.FormatInt(o.Amount, 10)
				rec[4], rec[5] = o.IdempotencyKey, o.Status
				rec[6] = strconv.FormatInt(o.Used, 10)
				rec[7] = strconv.FormatInt(o.Limit, 10)
				rec[8] = strconv.FormatInt(o.Remaining, 10)
				if o.Status != bulk.StatusGranted && o.Status != bulk.StatusDenied {
					// Nothing was decided: no counter values. An amount
					// of 0 is one that did not parse (the error names
					// the file's value) or was 0 (invalid either way).
					rec[6], rec[7], rec[8] = "", "", ""
					if o.Amount == 0 {
						rec[3] = ""
					}
				}
				rec[9], rec[10] = "", ""
				if o.GrantID != 0 {
					rec[9], rec[10] = strconv.FormatInt(o.GrantID, 10), strconv.FormatBool(o.Replayed)
				}
				rec[11] = o.Error
				return cw.Write(rec)
			}
			finish = func() error {
				cw.Flush()
				if err := cw.Error(); err != nil {
					return err
				}
				return bw.Flush()
			}
		}
	}

	a.poolSize = opts.workers
	c, err := a.quotaClient(ctx)
	if err != nil {
		return err
	}
	next := reader.Next
	unread := false // stdin after an interrupt: the rest is not read
	if opts.path == "-" {
		next = func() (bulk.Row, error) {
			if ctx.Err() != nil {
				unread = true
				return bulk.Row{}, io.EOF
			}
			return reader.Next()
		}
	}
	bad := 0
	sum, runErr := bulk.Run(ctx, c, next, bulk.Options{BatchSize: opts.batchSize, Workers: opts.workers, Decided: decided}, func(o bulk.Outcome) error {
		if o.Status == bulk.StatusError {
			bad++
			if bad <= maxBadLines {
				if bar != nil {
					_ = bar.Clear()
				}
				fmt.Fprintf(a.stderr, "pgquota: line %d: %s\n", o.Line, oneLine(o.Error))
			}
		}
		if bar != nil {
			_ = bar.Add(1)
		}
		if write != nil {
			return write(o)
		}
		return nil
	})
	if finish != nil {
		if err := finish(); err != nil && runErr == nil {
			runErr = fmt.Errorf("--out: %w", err)
		}
	}
	if bar != nil {
		_ = bar.Clear()
	}
	if bad > maxBadLines {
		fmt.Fprintf(a.stderr, "pgquota: ... and %d more bad rows%s\n", bad-maxBadLines, seeOut(opts.out))
	}
	res := fileSummary{Summary: sum, ElapsedMS: sum.Elapsed.Milliseconds(), File: opts.path, Out: opts.out}
	if opts.out == "-" {
		// stdout carries the outcomes: the summary goes to stderr.
		extra := ""
		for _, c := range []struct {
			n    int64
			what string
		}{{sum.Unknown, "unknown"}, {sum.NotRun, "not run"}, {sum.Skipped, "skipped"}, {sum.Replayed, "replayed"}} {
			if c.n > 0 {
				extra += fmt.Sprintf(", %d %s", c.n, c.what)
			}
		}
		if sum.Interrupted {
			extra += ", interrupted"
		}
		fmt.Fprintf(a.stderr, "pgquota: %s: %d rows: %d granted, %d denied, %d errors%s; %d batches in %.2fs (%.0f rows/s)\n",
			fileName(opts.path), sum.Rows, sum.Granted, sum.Denied, sum.Errors, extra, sum.Batches, sum.Elapsed.Seconds(), sum.RowsPerSec)
	} else {
		if err := a.output(res, func(w *tabwriter.Writer) {
			row(w, "file", res.File)
			if sum.Interrupted {
				row(w, "interrupted", "yes")
			}
			row(w, "rows", sum.Rows)
			row(w, "granted", sum.Granted)
			row(w, "denied", sum.Denied)
			row(w, "errors", sum.Errors)
			row(w, "unknown", sum.Unknown)
			row(w, "not run", sum.NotRun)
			row(w, "skipped", sum.Skipped)
			row(w, "replayed", sum.Replayed)
			row(w, "batches", sum.Batches)
			row(w, "seconds", fmt.Sprintf("%.2f", sum.Elapsed.Seconds()))
			row(w, "rows/s", fmt.Sprintf("%.0f", sum.RowsPerSec))
			if res.Out != "" {
				row(w, "outcomes", res.Out)
			}
		}); err != nil {
			return err
		}
	}
	if runErr != nil {
		a.resumeHint(opts, sum, unread)
		what := "stopped"
		if sum.Interrupted {
			what = "interrupted"
		}
		return fmt.Errorf("grant --file %s after %d rows had been decided: %w", what, sum.Granted+sum.Denied, runErr)
	}
	if sum.Errors > 0 {
		return usagef("%d of %d rows had errors and were not granted (their lines are listed above%s)", sum.Errors, sum.Rows, seeOut(opts.out))
	}
	return nil
}

// resumeHint tells, on stderr, how to finish a run that stopped: what a
// rerun of the same command does, and how to skip what was decided.
func (a *app) resumeHint(opts fileOptions, sum bulk.Summary, unread bool) {
	if unread {
		fmt.Fprintf(a.stderr, "pgquota: the rest of stdin was not read: its rows are not in the outcomes\n")
	}
	if sum.Unknown > 0 {
		fmt.Fprintf(a.stderr, "pgquota: %d rows have an unknown outcome (their batch may have committed): a keyed row replays when run again; check an unkeyed row's counter (pgquota usage) before granting it again\n", sum.Unknown)
	}
	if sum.Unkeyed == 0 {
		fmt.Fprintf(a.stderr, "pgquota: to resume, run the same command again: rows with an idempotency key replay their outcome and grant nothing more\n")
		return
	}
	if opts.out == "" || opts.out == "-" {
		fmt.Fprintf(a.stderr, "pgquota: warning: %d rows without an idempotency key were decided, and running the same command again grants them again; "+
			"this run wrote no --out file to skip them with: give the file idempotency keys, or pass --out next time\n", sum.Unkeyed)
		return
	}
	fmt.Fprintf(a.stderr, "pgquota: warning: %d rows without an idempotency key were decided: running the same command again grants them again. To resume, skip what was decided:\n"+
		"pgquota:   pgquota grant --file %s --skip-decided %s --out NEW-OUT\n"+
		"pgquota: (--skip-decided skips the rows it records as granted, denied or unknown: grant an unknown row again only after its counter shows it was not granted)\n", sum.Unkeyed, opts.path, opts.out)
}

// countLines counts the newlines of the file at path (a progress bar's
// total).
func countLines(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	buf := make([]byte, 1<<16)
	for {
		k, err := f.Read(buf)
		n += int64(bytes.Count(buf[:k], []byte{'\n'}))
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// readDecided reads an earlier run's --out file (CSV with its header, or
// JSON lines) and returns, by line, the rows it records as granted,
// denied or skipped.
func readDecided(path string) (map[int]bulk.Decided, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	decided := map[int]bulk.Decided{}
	isDecided := func(status string) bool {
		// An unknown row is skipped too: its batch may have committed, so
		// granting it again could grant twice (the hint says to check it).
		return status == bulk.StatusGranted || status == bulk.StatusDenied || status == bulk.StatusSkipped || status == bulk.StatusUnknown
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(data))
		for n := 1; ; n++ {
			var o bulk.Outcome
			if err := dec.Decode(&o); err == io.EOF {
				break
			} else if err != nil {
				return nil, fmt.Errorf("JSON line %d: %w", n, err)
			}
			if isDecided(o.Status) {
				decided[o.Line] = bulk.Decided{Line: o.Line, Quota: o.Quota, Member: o.Member, Amount: o.Amount}
			}
		}
		return decided, nil
	}
	cr := csv.NewReader(bytes.NewReader(data))
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, need := range []string{"line", "quota", "member", "amount", "status"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("not a grant --out file: no %q column", need)
		}
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return decided, nil
		}
		if err != nil {
			return nil, err
		}
		if !isDecided(rec[col["status"]]) {
			continue
		}
		line, err := strconv.Atoi(rec[col["line"]])
		if err != nil {
			return nil, fmt.Errorf("line column: %q is not a number", rec[col["line"]])
		}
		amount, err := strconv.ParseInt(rec[col["amount"]], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: amount %q is not a number", line, rec[col["amount"]])
		}
		decided[line] = bulk.Decided{Line: line, Quota: rec[col["quota"]], Member: rec[col["member"]], Amount: amount}
	}
}

// fileName names --file in messages.
func fileName(path string) string {
	if path == "-" {
		return "stdin"
	}
	return path
}

func seeOut(out string) string {
	if out == "" || out == "-" {
		return ""
	}
	return "; every row's outcome is in " + out
}
