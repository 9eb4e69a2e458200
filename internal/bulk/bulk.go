// Package bulk grants the rows of a CSV file (`pgquota grant --file`).
//
// Rows are read with encoding/csv, routed by counter (quota and member) to
// a few workers, and granted with quota.Client.GrantBatch: one statement
// and one durable commit per batch of rows. A worker owns its counters, so
// the rows of one counter are decided one after another in file order
// (batches of a worker run one after another, and GrantBatch decides the
// rows of a counter in order), and two workers never wait for each other's
// row locks. The workers' statements run at the same time on their own
// connections, so their commits' WAL flushes overlap (PostgreSQL's group
// commit) and both server cores work.
//
// Outcomes come back in file order. A bad row (a malformed record, a bad
// value, an undefined quota, no limit) is reported with its line number and
// does not stop the others.
//
// A row with an idempotency_key is recorded in the grant ledger under its
// own grant id, in the same transaction as its batch's grants (see
// quota.Client.GrantBatch): running the same file again replays those rows'
// first outcomes and grants them nothing more.
package bulk

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquota/pgquota/quota"
)

// Columns a file's header may name. quota, member and amount are required.
const (
	ColQuota          = "quota"
	ColMember         = "member"
	ColAmount         = "amount"
	ColLimit          = "limit"
	ColIdempotencyKey = "idempotency_key"
)

// Row is one record of a file.
type Row struct {
	// Seq numbers the records from 0, in file order.
	Seq int64
	// Line is the file line the record starts on (1 is the header).
	Line int
	// Request is the grant the row asks for.
	Request quota.GrantRequest
	// IdempotencyKey is the row's idempotency_key column ("" when absent).
	IdempotencyKey string
	// Err is why the record cannot be granted (malformed, bad value); nil
	// when it can be sent.
	Err error
}

// bom is UTF-8's byte order mark.
const bom = "\ufeff"

// Reader reads the rows of a CSV file whose first record is a header.
type Reader struct {
	csv  *csv.Reader
	cols map[string]int
	n    int // fields per record, from the header
	seq  int64
}

// NewReader reads the header of r and returns a Reader for its rows. The
// header names the columns, in any order: quota, member and amount are
// required, limit and idempotency_key optional. Errors name a missing,
// repeated or unknown column, or an unreadable header.
func NewReader(r io.Reader) (*Reader, error) {
	// A byte order mark is dropped before the CSV reader sees it: as part of
	// the first field it would turn a quoted first column name into a bare
	// quote.
	br := bufio.NewReader(r)
	if b, err := br.Peek(len(bom)); err == nil && string(b) == bom {
		_, _ = br.Discard(len(bom))
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1 // checked per row, so that a bad row does not stop the file
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err == io.EOF {
		return nil, errors.New("the file is empty: want a header line quota,member,amount[,limit,idempotency_key]")
	}
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	cols := map[string]int{}
	for i, name := range head {
		name = strings.ToLower(strings.TrimSpace(name))
		switch name {
		case ColQuota, ColMember, ColAmount, ColLimit, ColIdempotencyKey:
		default:
			return nil, fmt.Errorf("header: unknown column %q (want quota,member,amount[,limit,idempotency_key])", name)
		}
		if _, dup := cols[name]; dup {
			return nil, fmt.Errorf("header: column %q appears twice", name)
		}
		cols[name] = i
	}
	for _, need := range []string{ColQuota, ColMember, ColAmount} {
		if _, ok := cols[need]; !ok {
			return nil, fmt.Errorf("header: column %q is missing (want quota,member,amount[,limit,idempotency_key])", need)
		}
	}
	return &Reader{csv: cr, cols: cols, n: len(head)}, nil
}

// Next returns the next row, or io.EOF after the last one. A malformed
// record is a row with Err set, not an error; the error is for a failed
// read of the input itself.
func (r *Reader) Next() (Row, error) {
	rec, err := r.csv.Read()
	if err == io.EOF {
		return Row{}, io.EOF
	}
	row := Row{Seq: r.seq}
	r.seq++
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		row.Line = pe.StartLine
		row.Err = fmt.Errorf("malformed CSV: %w", pe.Err)
		return row, nil
	}
	if err != nil {
		return Row{}, err
	}
	row.Line, _ = r.csv.FieldPos(0)
	if len(rec) != r.n {
		row.Err = fmt.Errorf("want %d fields as in the header, got %d", r.n, len(rec))
		return row, nil
	}
	field := func(col string) string {
		if i, ok := r.cols[col]; ok {
			return rec[i]
		}
		return ""
	}
	row.Request.Quota = field(ColQuota)
	row.Request.Member = field(ColMember)
	row.IdempotencyKey = field(ColIdempotencyKey)
	amount := strings.TrimSpace(field(ColAmount))
	if row.Request.Amount, err = strconv.ParseInt(amount, 10, 64); err != nil {
		row.Err = fmt.Errorf("amount: not an integer: %q", amount)
		return row, nil
	}
	if limit := strings.TrimSpace(field(ColLimit)); limit != "" {
		v, err := strconv.ParseInt(limit, 10, 64)
		if err != nil {
			row.Err = fmt.Errorf("limit: not an integer: %q", limit)
			return row, nil
		}
		row.Request.Limit = &v
	}
	if row.IdempotencyKey != "" {
		// The key's scope is the quota (quota.IdempotencyKey's default).
		row.Request.Idempotency = quota.IdempotencyKey{Key: row.IdempotencyKey}
	}
	return row, nil
}

// Status of a row's outcome. Every row of a run gets exactly one.
const (
	// StatusGranted and StatusDenied are decided rows.
	StatusGranted = "granted"
	StatusDenied  = "denied"
	// StatusError is a bad row (malformed, a bad value, an undefined
	// quota, no limit): nothing was written for it, and running it again
	// fails the same way until the row or the quota is fixed.
	StatusError = "error"
	// StatusUnknown is a row whose batch was sent but whose reply was lost
	// (the connection broke, or the run's drain time ran out): the batch
	// may have committed. A keyed row's outcome is learnt by running it
	// again (it replays); an unkeyed row's only from its counter.
	StatusUnknown = "unknown"
	// StatusNotRun is a row that was never sent (the run stopped first),
	// or whose batch failed with nothing written: running it again is
	// safe.
	StatusNotRun = "not_run"
	// StatusSkipped is a row decided by an earlier run (Options.Decided):
	// not sent again.
	StatusSkipped = "skipped"
)

// Outcome is what became of one row.
type Outcome struct {
	// Line is the file line the row starts on.
	Line           int    `json:"line"`
	Quota          string `json:"quota"`
	Member         string `json:"member"`
	Amount         int64  `json:"amount"`
	IdempotencyKey string `json:"idempotency_key"`
	// Status is one of the Status constants.
	Status string `json:"status"`
	// Used, Limit and Remaining are as in quota.GrantResult (zero unless
	// the row was decided).
	Used      int64 `json:"used"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// GrantID is the ledger entry of a row with an idempotency key (its
	// grant id), and Replayed reports that the key was used before (by an
	// earlier run of the file, say): the outcome is the stored first one,
	// and nothing was granted again.
	GrantID  int64 `json:"grant_id"`
	Replayed bool  `json:"replayed"`
	// Error says why the row was not decided (statuses error, unknown and
	// not_run).
	Error string `json:"error"`

	seq int64
}

// Summary counts what a run did: Rows is the sum of the per-status counts.
type Summary struct {
	Rows    int64 `json:"rows"`
	Granted int64 `json:"granted"`
	Denied  int64 `json:"denied"`
	// Errors counts bad rows (StatusError).
	Errors  int64 `json:"errors"`
	Unknown int64 `json:"unknown"`
	NotRun  int64 `json:"not_run"`
	Skipped int64 `json:"skipped"`
	// Replayed counts the granted or denied rows whose outcome was
	// replayed from the ledger (their key was used before): nothing was
	// granted for them by this run.
	Replayed int64 `json:"replayed"`
	// Unkeyed counts the rows without an idempotency key that were
	// granted, denied or have an unknown outcome: running them again would
	// grant them again.
	Unkeyed int64 `json:"unkeyed_decided"`
	// Interrupted reports that the run's context ended before every row
	// was run (Ctrl-C): the rows in flight were still decided (see
	// Options.DrainTimeout), the rest are StatusNotRun.
	Interrupted bool `json:"interrupted"`
	// Batches is the number of batch statements (each one commit).
	Batches int64 `json:"batches"`
	// Elapsed is the run's wall time (elapsed_ms in JSON, whole
	// milliseconds, as every duration pgquota --json prints); RowsPerSec is
	// the rows run (neither not run nor skipped) per second.
	Elapsed    time.Duration `json:"-"`
	RowsPerSec float64       `json:"rows_per_sec"`
}

// Decided is a row an earlier run decided, as its outcome file records
// it; Options.Decided skips such rows.
type Decided struct {
	Line   int
	Quota  string
	Member string
	Amount int64
}

// Options tune a run.
type Options struct {
	// BatchSize is the number of rows per statement. Defaults to 2000.
	BatchSize int
	// Workers is the number of batches in flight at once, each on its own
	// connection (the client's pool should hold at least as many).
	// Defaults to 4.
	Workers int
	// DrainTimeout is how long the batches already sent when the run's
	// context ends may still take to commit and report: their rows are
	// then decided, not unknown. Defaults to 30 seconds.
	DrainTimeout time.Duration
	// Decided holds, by line, the rows an earlier run decided: they are
	// reported StatusSkipped and not sent. A row whose quota, member or
	// amount differs from its Decided entry stops the run with an error
	// (the file is not the one the earlier run read).
	Decided map[int]Decided
}

// batchRetries bounds the attempts of a batch that failed with a
// serialization failure or deadlock (rolled back, so safe to run again).
const batchRetries = 5

// errStopped is the cause of rows not run after the run stopped.
var errStopped = errors.New("the run stopped before this row's batch was sent")

// Run grants every row next returns, until io.EOF, and passes each row's
// outcome to emit in file order: every row gets exactly one outcome (see
// the Status constants). When ctx ends (an interrupt), no new batch is
// sent; the batches in flight run on for up to Options.DrainTimeout so
// that their rows are decided, and the rows read after that are reported
// StatusNotRun (next is still called until io.EOF). A batch that fails for
// another reason than a serialization failure or deadlock (the database
// is unreachable, say) stops the run the same way. Run returns the
// summary and, for a stopped run, ctx's error or the batch's error; the
// first error of next or emit also stops it (nothing is emitted after a
// failed emit, and next is not called after a failed read).
func Run(ctx context.Context, client *quota.Client, next func() (Row, error), opts Options, emit func(Outcome) error) (Summary, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 2000
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	start := time.Now()
	// stop ends the run early (ctx, a failed batch, read or emit): no
	// batch is sent after it.
	stop, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Statements run under send: ctx's values, but not its cancellation,
	// until DrainTimeout after ctx ended, so that a batch in flight at an
	// interrupt still commits and reports (its outcome is known).
	send, cancelSend := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSend()
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
		case <-finished:
			return
		}
		t := time.NewTimer(opts.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancelSend()
		case <-finished:
		}
	}()

	outcomes := make(chan Outcome, opts.BatchSize*opts.Workers)
	inputs := make([]chan Row, opts.Workers)
	var wg sync.WaitGroup
	var batches sync.Map // worker -> count, read after wg.Wait
	for w := range inputs {
		inputs[w] = make(chan Row, opts.BatchSize)
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := worker(send, stop, client, inputs[w], opts.BatchSize, outcomes, cancel)
			batches.Store(w, n)
		}()
	}

	// The reader: parse errors, skipped rows and, after a stop, rows not
	// run go straight out, the rest to the worker of their counter.
	var emitFailed atomic.Bool
	readErr := make(chan error, 1)
	wg.Add(1) // outcomes closes after the reader too
	go func() {
		defer wg.Done()
		defer func() {
			for _, in := range inputs {
				close(in)
			}
		}()
		seed := maphash.MakeSeed()
		// keyWorker remembers the worker of each idempotency key's first
		// row. A later row with the same key goes to that worker, behind
		// the first: the first line takes the key, as in a sequential run,
		// and the later one replays it (the same request) or fails with
		// ErrIdempotencyKeyReused having written nothing (another request,
		// which is why taking it out of its own counter's worker is safe).
		keyWorker := map[string]uint64{}
		for {
			if emitFailed.Load() {
				readErr <- nil
				return
			}
			row, err := next()
			if err == io.EOF {
				readErr <- nil
				return
			}
			if err != nil {
				cancel(err)
				readErr <- err
				return
			}
			if row.Err != nil {
				outcomes <- errorOutcome(row, StatusError, row.Err) // the emitter drains until the end
				continue
			}
			if d, ok := opts.Decided[row.Line]; ok {
				if d.Quota != row.Request.Quota || d.Member != row.Request.Member || d.Amount != row.Request.Amount {
					err := fmt.Errorf("line %d is %s,%s,%d here but %s,%s,%d in the outcomes of the earlier run: not the same file",
						row.Line, row.Request.Quota, row.Request.Member, row.Request.Amount, d.Quota, d.Member, d.Amount)
					cancel(err)
					readErr <- err
					return
				}
				outcomes <- errorOutcome(row, StatusSkipped, nil)
				continue
			}
			if stop.Err() != nil {
				outcomes <- errorOutcome(row, StatusNotRun, errStopped)
				continue
			}
			w := maphash.String(seed, row.Request.Quota+"\x00"+row.Request.Member) % uint64(len(inputs))
			if k := row.Request.Idempotency; k.Key != "" {
				scope := k.Scope
				if scope == "" {
					scope = row.Request.Quota
				}
				id := scope + "\x00" + k.Key
				if first, ok := keyWorker[id]; ok {
					w = first
				} else {
					keyWorker[id] = w
				}
			}
			select {
			case inputs[w] <- row:
			case <-stop.Done():
				outcomes <- errorOutcome(row, StatusNotRun, errStopped)
			}
		}
	}()
	go func() {
		wg.Wait()
		close(outcomes)
	}()

	// The emitter: outcomes in file order.
	var sum Summary
	var emitErr error
	pending := map[int64]Outcome{}
	var nextSeq int64
	for o := range outcomes {
		if emitErr != nil {
			continue // drain
		}
		pending[o.seq] = o
		for {
			o, ok := pending[nextSeq]
			if !ok {
				break
			}
			delete(pending, nextSeq)
			nextSeq++
			sum.count(o)
			if err := emit(o); err != nil {
				emitErr = err
				emitFailed.Store(true)
				cancel(err)
				break
			}
		}
	}
	// After a failed read, rows may be missing from the sequence: the
	// outcomes of the rows that were decided all the same are emitted
	// too, in file order.
	rest := make([]int64, 0, len(pending))
	for seq := range pending {
		rest = append(rest, seq)
	}
	slices.Sort(rest)
	for _, seq := range rest {
		o := pending[seq]
		sum.count(o)
		if emitErr == nil {
			if err := emit(o); err != nil {
				emitErr = err
			}
		}
	}
	if rerr := <-readErr; rerr != nil && emitErr == nil {
		emitErr = fmt.Errorf("read: %w", rerr)
	}
	batches.Range(func(_, v any) bool { sum.Batches += v.(int64); return true })
	sum.Elapsed = time.Since(start)
	if sum.Elapsed > 0 {
		sum.RowsPerSec = float64(sum.Rows-sum.NotRun-sum.Skipped) / sum.Elapsed.Seconds()
	}
	sum.Interrupted = ctx.Err() != nil
	if emitErr != nil {
		return sum, emitErr
	}
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	return sum, context.Cause(stop)
}

// count adds an outcome to the summary.
func (s *Summary) count(o Outcome) {
	s.Rows++
	switch o.Status {
	case StatusGranted:
		s.Granted++
	case StatusDenied:
		s.Denied++
	case StatusUnknown:
		s.Unknown++
	case StatusNotRun:
		s.NotRun++
	case StatusSkipped:
		s.Skipped++
	default:
		s.Errors++
	}
	if o.Replayed {
		s.Replayed++
	}
	switch o.Status {
	case StatusGranted, StatusDenied, StatusUnknown:
		if o.IdempotencyKey == "" {
			s.Unkeyed++
		}
	}
}

// worker grants the rows of in, batch by batch, until in is closed, and
// returns the number of statements it sent. Every row it receives gets an
// outcome. Statements run under send; after stop, the rows it still
// receives (and a batch not sent yet) are reported not run. A batch stops
// the run (cancel) when its statement failed for another reason than a
// serialization failure or a deadlock.
func worker(send, stop context.Context, client *quota.Client, in <-chan Row, size int, out chan<- Outcome, cancel context.CancelCauseFunc) int64 {
	var n int64
	batch := make([]Row, 0, size)
	reqs := make([]quota.GrantRequest, 0, size)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		defer func() { batch = batch[:0] }()
		if stop.Err() != nil {
			for _, r := range batch {
				out <- errorOutcome(r, StatusNotRun, errStopped)
			}
			return
		}
		reqs = reqs[:0]
		for _, r := range batch {
			reqs = append(reqs, r.Request)
		}
		var res []quota.BatchOutcome
		var err error
		for attempt := 1; ; attempt++ {
			n++
			res, err = client.GrantBatch(send, reqs)
			if err == nil || attempt == batchRetries || !retryable(err) {
				break
			}
			select {
			case <-time.After(time.Duration(attempt) * 10 * time.Millisecond):
				continue
			case <-stop.Done():
			}
			break // rolled back: nothing was written
		}
		// The emitter drains outcomes until the end: a decided row is
		// always reported.
		for i, r := range batch {
			switch {
			case err == nil:
				out <- outcome(r, res[i])
			case outcomeUnknown(err):
				out <- errorOutcome(r, StatusUnknown, fmt.Errorf("outcome unknown (the batch may have committed): %w", err))
			default:
				out <- errorOutcome(r, StatusNotRun, fmt.Errorf("batch failed, nothing granted: %w", err))
			}
		}
		if err != nil {
			cancel(fmt.Errorf("batch from line %d: %w", batch[0].Line, err))
		}
	}
	for r := range in {
		batch = append(batch, r)
		if len(batch) == size || stop.Err() != nil {
			flush()
		}
	}
	flush()
	return n
}

// retryable reports a serialization failure or a deadlock: the statement
// rolled back and may run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// outcomeUnknown reports whether a failed batch may have committed: the
// batch's statement (or its COMMIT) was sent and no reply said how it
// ended (quota.ErrOutcomeUnknown: a lost connection, a context that ended
// while it ran).
func outcomeUnknown(err error) bool {
	return errors.Is(err, quota.ErrOutcomeUnknown)
}

// errorOutcome is the outcome of a row that was not decided: status
// error, unknown, not_run or skipped, with err's message (none for nil).
func errorOutcome(r Row, status string, err error) Outcome {
	o := Outcome{
		seq: r.Seq, Line: r.Line, Quota: r.Request.Quota, Member: r.Request.Member,
		Amount: r.Request.Amount, IdempotencyKey: r.IdempotencyKey,
		Status: status,
	}
	if err != nil {
		o.Error = strings.TrimPrefix(err.Error(), "pgquota: ")
	}
	return o
}

func outcome(r Row, b quota.BatchOutcome) Outcome {
	if b.Err != nil {
		return errorOutcome(r, StatusError, b.Err)
	}
	o := Outcome{
		seq: r.Seq, Line: r.Line, Quota: r.Request.Quota, Member: r.Request.Member,
		Amount: r.Request.Amount, IdempotencyKey: r.IdempotencyKey,
		Status: StatusDenied, Used: b.Used, Limit: b.Limit, Remaining: b.Remaining,
		GrantID: b.GrantID, Replayed: b.Replayed,
	}
	if b.Granted {
		o.Status = StatusGranted
	}
	return o
}
