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

// Status of a row's outcome.
const (
	StatusGranted = "granted"
	StatusDenied  = "denied"
	StatusError   = "error"
)

// Outcome is what became of one row.
type Outcome struct {
	// Line is the file line the row starts on.
	Line           int    `json:"line"`
	Quota          string `json:"quota"`
	Member         string `json:"member"`
	Amount         int64  `json:"amount"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Status is granted, denied or error.
	Status string `json:"status"`
	// Used, Limit and Remaining are as in quota.GrantResult (zero for an
	// error).
	Used      int64 `json:"used"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// GrantID is the ledger entry of a row with an idempotency key (its
	// grant id), and Replayed reports that the key was used before (by an
	// earlier run of the file, say): the outcome is the stored first one,
	// and nothing was granted again.
	GrantID  int64 `json:"grant_id,omitempty"`
	Replayed bool  `json:"replayed,omitempty"`
	// Error says why the row was not decided (Status error).
	Error string `json:"error,omitempty"`

	seq int64
}

// Summary counts what a run did.
type Summary struct {
	Rows    int64 `json:"rows"`
	Granted int64 `json:"granted"`
	Denied  int64 `json:"denied"`
	Errors  int64 `json:"errors"`
	// Batches is the number of batch statements (each one commit).
	Batches int64 `json:"batches"`
	// Seconds is the run's wall time; RowsPerSec is Rows / Seconds.
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// Options tune a run.
type Options struct {
	// BatchSize is the number of rows per statement. Defaults to 2000.
	BatchSize int
	// Workers is the number of batches in flight at once, each on its own
	// connection (the client's pool should hold at least as many).
	// Defaults to 4.
	Workers int
}

// batchRetries bounds the attempts of a batch that failed with a
// serialization failure or deadlock (rolled back, so safe to run again).
const batchRetries = 5

// Run grants every row next returns, until io.EOF, and passes each row's
// outcome to emit in file order. It stops at the first error of next or
// emit, or of a batch statement that failed for another reason than a bad
// row (the database is unreachable, say): the rows of that batch are
// emitted with status error, the ones after it are not processed, and the
// error is returned with the summary so far.
func Run(ctx context.Context, client *quota.Client, next func() (Row, error), opts Options, emit func(Outcome) error) (Summary, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 2000
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	start := time.Now()
	// stop ends the run early (a failed batch, a failed read or emit). It
	// only keeps new batches from starting: a statement already sent runs
	// under ctx alone, so that its outcome is known and reported.
	stop, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	outcomes := make(chan Outcome, opts.BatchSize*opts.Workers)
	inputs := make([]chan Row, opts.Workers)
	var wg sync.WaitGroup
	var batches sync.Map // worker -> count, read after wg.Wait
	for w := range inputs {
		inputs[w] = make(chan Row, opts.BatchSize)
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := worker(ctx, stop, client, inputs[w], opts.BatchSize, outcomes, cancel)
			batches.Store(w, n)
		}()
	}

	// The reader: parse errors go straight out, the rest to the worker of
	// their counter.
	readErr := make(chan error, 1)
	wg.Add(1) // outcomes closes after the reader too: it sends parse errors
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
			if stop.Err() != nil {
				readErr <- nil
				return
			}
			if row.Err != nil {
				outcomes <- errorOutcome(row, row.Err) // the emitter drains until the end
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
				readErr <- nil
				return
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
				cancel(err)
				break
			}
		}
	}
	// After a stop, rows are missing from the sequence: the outcomes of the
	// rows that were decided all the same are emitted too, in file order.
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
	sum.Seconds = time.Since(start).Seconds()
	if sum.Seconds > 0 {
		sum.RowsPerSec = float64(sum.Rows) / sum.Seconds
	}
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
	default:
		s.Errors++
	}
}

// worker grants the rows of in, batch by batch, and returns the number of
// statements it sent. Statements run under ctx; stop ends the loop between
// batches. A batch stops the run (cancel) when its statement failed for
// another reason than a serialization failure or a deadlock.
func worker(ctx, stop context.Context, client *quota.Client, in <-chan Row, size int, out chan<- Outcome, cancel context.CancelCauseFunc) int64 {
	var n int64
	batch := make([]Row, 0, size)
	reqs := make([]quota.GrantRequest, 0, size)
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		reqs = reqs[:0]
		for _, r := range batch {
			reqs = append(reqs, r.Request)
		}
		var res []quota.BatchOutcome
		var err error
		for attempt := 1; ; attempt++ {
			n++
			res, err = client.GrantBatch(ctx, reqs)
			if err == nil || attempt == batchRetries || !retryable(err) {
				break
			}
			select {
			case <-time.After(time.Duration(attempt) * 10 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		for i, r := range batch {
			// The emitter drains outcomes until the end: a decided row is
			// always reported.
			if err != nil {
				out <- errorOutcome(r, batchError(err))
			} else {
				out <- outcome(r, res[i])
			}
		}
		if err != nil {
			cancel(fmt.Errorf("batch from line %d: %w", batch[0].Line, err))
		}
		batch = batch[:0]
		return err == nil
	}
	for {
		select {
		case r, open := <-in:
			if !open {
				if stop.Err() == nil {
					flush()
				}
				return n
			}
			batch = append(batch, r)
			if len(batch) == size && (stop.Err() != nil || !flush()) {
				return n
			}
		case <-stop.Done():
			return n
		}
	}
}

// retryable reports a serialization failure or a deadlock: the statement
// rolled back and may run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// batchError is a row's error when its whole batch failed: the outcome is
// unknown when the statement may have reached the server.
func batchError(err error) error {
	if pgconn.SafeToRetry(err) {
		return fmt.Errorf("not sent: %w", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("batch failed, nothing granted: %w", err)
	}
	return fmt.Errorf("outcome unknown (the batch may have committed): %w", err)
}

func errorOutcome(r Row, err error) Outcome {
	return Outcome{
		seq: r.Seq, Line: r.Line, Quota: r.Request.Quota, Member: r.Request.Member,
		Amount: r.Request.Amount, IdempotencyKey: r.IdempotencyKey,
		Status: StatusError, Error: strings.TrimPrefix(err.Error(), "pgquota: "),
	}
}

func outcome(r Row, b quota.BatchOutcome) Outcome {
	if b.Err != nil {
		return errorOutcome(r, b.Err)
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
