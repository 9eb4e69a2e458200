package cli

import (
	"bufio"
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
	path, out, format  string
	batchSize, workers int
}

// maxBadLines is how many bad rows grant --file lists on stderr; the rest
// are counted (and all are in --out).
const maxBadLines = 20

// fileSummary is grant --file's result, as --json prints it.
type fileSummary struct {
	bulk.Summary
	File string `json:"file"`
	Out  string `json:"out,omitempty"`
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

	var in io.Reader = cmd.InOrStdin()
	var size int64 = -1
	if opts.path != "-" {
		f, err := os.Open(opts.path)
		if err != nil {
			return usagef("--file: %v", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			size = st.Size()
		}
		in = f
	}
	var bar *progressbar.ProgressBar
	if w := a.progressWriter(false); w != nil {
		bar = progressbar.NewOptions64(size,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionFullWidth(),
			progressbar.OptionSetDescription("granting"),
		)
		defer func() { _ = bar.Clear(); fmt.Fprint(w, "\r") }()
		in = io.TeeReader(in, bar)
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
				if o.Status == bulk.StatusError {
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
	bad := 0
	var done int64
	sum, runErr := bulk.Run(ctx, c, reader.Next, bulk.Options{BatchSize: opts.batchSize, Workers: opts.workers}, func(o bulk.Outcome) error {
		if o.Status == bulk.StatusError {
			bad++
			if bad <= maxBadLines {
				if bar != nil {
					_ = bar.Clear()
				}
				fmt.Fprintf(a.stderr, "pgquota: line %d: %s\n", o.Line, oneLine(o.Error))
			}
		}
		if done++; bar != nil && done%1000 == 0 {
			bar.Describe(fmt.Sprintf("granting: %d rows", done))
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
	res := fileSummary{Summary: sum, File: opts.path, Out: opts.out}
	if opts.out == "-" {
		// stdout carries the outcomes: the summary goes to stderr.
		fmt.Fprintf(a.stderr, "pgquota: %s: %d rows: %d granted, %d denied, %d errors; %d batches in %.2fs (%.0f rows/s)\n",
			fileName(opts.path), sum.Rows, sum.Granted, sum.Denied, sum.Errors, sum.Batches, sum.Seconds, sum.RowsPerSec)
	} else {
		if err := a.output(res, func(w *tabwriter.Writer) {
			row(w, "file", res.File)
			row(w, "rows", sum.Rows)
			row(w, "granted", sum.Granted)
			row(w, "denied", sum.Denied)
			row(w, "errors", sum.Errors)
			row(w, "batches", sum.Batches)
			row(w, "seconds", fmt.Sprintf("%.2f", sum.Seconds))
			row(w, "rows/s", fmt.Sprintf("%.0f", sum.RowsPerSec))
			if res.Out != "" {
				row(w, "outcomes", res.Out)
			}
		}); err != nil {
			return err
		}
	}
	if runErr != nil {
		return fmt.Errorf("grant --file stopped after %d rows: %w", sum.Rows, runErr)
	}
	if sum.Errors > 0 {
		return usagef("%d of %d rows had errors and were not granted (their lines are listed above%s)", sum.Errors, sum.Rows, seeOut(opts.out))
	}
	return nil
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
