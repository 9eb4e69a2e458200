package fence_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// Pauses by stopping a real process. The history harness re-executes the
// test binary as a worker (TestFenceHistoryStoppedProcessWriteIsRefused
// with historyWorkerEnv set to a database URL), which runs the store
// operations it reads on stdin and answers on stdout, one JSON object per
// line. When a write asks for a pause, the worker says so and then waits to
// be continued: the harness stops it with SIGSTOP, checks that the kernel
// reports it stopped, lets the lease expire and a successor acquire it,
// and continues it with SIGCONT, upon which the write goes ahead. Nothing
// in the worker runs while it is stopped: not its connection, not its
// timers, as in a process paused by a long GC or a stalled VM.

// historyWorkerEnv names the variable that makes the test binary a worker.
const historyWorkerEnv = "PGQUOTA_FENCE_HISTORY_WORKER_DB"

// historyWorkerPrefix starts every line the worker writes for the harness.
const historyWorkerPrefix = "@fence-history "

type historyWorkerRequest struct {
	Variant  string        `json:"variant"`
	Op       string        `json:"op"`
	Resource string        `json:"resource"`
	Holder   string        `json:"holder,omitempty"`
	Key      string        `json:"key,omitempty"`
	Value    string        `json:"value,omitempty"`
	Token    int64         `json:"token,omitempty"`
	TTL      time.Duration `json:"ttl,omitempty"`
	Leased   bool          `json:"leased,omitempty"`
	Pause    bool          `json:"pause,omitempty"`
}

type historyWorkerReply struct {
	Paused  bool      `json:"paused,omitempty"` // the write reached its pause
	Token   int64     `json:"token,omitempty"`
	At      time.Time `json:"at"`
	Expires time.Time `json:"expires"`
	Value   string    `json:"value,omitempty"`
	// Kind is "held", "lost" or "stale" for the library's errors, "error"
	// for any other; Err is the error's text.
	Kind string `json:"kind,omitempty"`
	Err  string `json:"err,omitempty"`
}

// lockedBuffer collects a worker's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

// historyWorker is a worker process, used by one run at a time.
type historyWorker struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan historyWorkerReply
	exited  chan struct{}
	// done is closed when the test ends, so that the reader stops waiting
	// for somebody to take a reply.
	done   chan struct{}
	stderr *lockedBuffer

	mu      sync.Mutex // one call at a time
	stopped bool
}

// startHistoryWorker starts a worker on the database at url; it is ended
// when the test ends.
func startHistoryWorker(t *testing.T, url string) *historyWorker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFenceHistoryStoppedProcessWriteIsRefused$", "-test.count=1")
	cmd.Env = append(os.Environ(), historyWorkerEnv+"="+url, pgtest.EnvAppRole+"=0") // as the owner, as the setup's pool
	w := &historyWorker{cmd: cmd, replies: make(chan historyWorkerReply), exited: make(chan struct{}), done: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stderr = w.stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start(), "start a worker process")
	w.stdin = stdin
	go func() {
		defer close(w.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), historyWorkerPrefix)
			if !ok {
				continue // the test framework's own output
			}
			var r historyWorkerReply
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				r = historyWorkerReply{Kind: "error", Err: fmt.Sprintf("unreadable reply %q: %v", line, err)}
			}
			select {
			case w.replies <- r:
			case <-w.done: // the test ended: nobody reads replies any more
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		// Continue it if a failed run left it stopped, close its stdin
		// (it exits on EOF), and kill it if it does not.
		close(w.done)
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = stdin.Close()
		select {
		case <-w.exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-w.exited
		}
	})
	return w
}

func (w *historyWorker) pid() int { return w.cmd.Process.Pid }

// call sends req and returns the reply; onPaused runs when the worker
// reports that it reached a pause, and the call waits for it.
func (w *historyWorker) call(ctx context.Context, req historyWorkerRequest, onPaused func()) (historyWorkerReply, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return historyWorkerReply{}, err
	}
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return historyWorkerReply{}, fmt.Errorf("worker %d: send: %w; stderr:\n%s", w.pid(), err, w.stderr.tail())
	}
	for {
		select {
		case r := <-w.replies:
			if r.Paused {
				if onPaused == nil {
					return r, fmt.Errorf("worker %d paused unasked", w.pid())
				}
				onPaused()
				continue
			}
			return r, nil
		case <-w.exited:
			return historyWorkerReply{}, fmt.Errorf("worker %d exited; stderr:\n%s", w.pid(), w.stderr.tail())
		case <-ctx.Done():
			return historyWorkerReply{}, fmt.Errorf("worker %d did not answer %s: %w; stderr:\n%s", w.pid(), req.Op, ctx.Err(), w.stderr.tail())
		}
	}
}

// processState returns the state letter the kernel reports for pid ("R",
// "S", "T" for stopped, ...), from /proc/<pid>/stat.
func processState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 || i+2 >= len(s) {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2 : i+3], nil
}

// stop sends SIGSTOP and waits until the kernel reports the process
// stopped.
func (w *historyWorker) stop() error {
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stop worker %d: %w", w.pid(), err)
	}
	w.stopped = true
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := processState(w.pid())
		if err != nil {
			return fmt.Errorf("stop worker %d: %w", w.pid(), err)
		}
		if st == "T" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker %d not stopped 5s after SIGSTOP (state %s)", w.pid(), st)
		}
		time.Sleep(time.Millisecond)
	}
}

// cont continues a stopped worker; it does nothing to a running one.
func (w *historyWorker) cont() error {
	if !w.stopped {
		return nil
	}
	w.stopped = false
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("continue worker %d: %w", w.pid(), err)
	}
	return nil
}

// historyProcessStore is historyStore over a worker process running the
// store of variant.
type historyProcessStore struct {
	w       *historyWorker
	variant string
}

func (p historyProcessStore) do(ctx context.Context, req historyWorkerRequest, onPaused func()) (historyWorkerReply, error) {
	req.Variant = p.variant
	r, err := p.w.call(ctx, req, onPaused)
	if err != nil {
		return r, err
	}
	switch r.Kind {
	case "":
		return r, nil
	case "held":
		return r, fmt.Errorf("%w (worker: %s)", lease.ErrHeld, r.Err)
	case "lost":
		return r, fmt.Errorf("%w (worker: %s)", lease.ErrLost, r.Err)
	case "stale":
		return r, fmt.Errorf("%w (worker: %s)", fence.ErrStaleToken, r.Err)
	}
	return r, fmt.Errorf("worker %d: %s", p.w.pid(), r.Err)
}

func (p historyProcessStore) grant(ctx context.Context, req historyWorkerRequest) (leaseGrant, error) {
	r, err := p.do(ctx, req, nil)
	return leaseGrant{token: r.Token, at: r.At, expires: r.Expires}, err
}

func (p historyProcessStore) acquire(ctx context.Context, resource, holder string, ttl time.Duration, hold func(context.Context, uint32)) (leaseGrant, error) {
	if hold != nil {
		return leaseGrant{}, errors.New("a worker process cannot hold its acquiring transaction open")
	}
	return p.grant(ctx, historyWorkerRequest{Op: "acquire", Resource: resource, Holder: holder, TTL: ttl})
}

func (p historyProcessStore) renew(ctx context.Context, resource string, token int64, ttl time.Duration) (leaseGrant, error) {
	return p.grant(ctx, historyWorkerRequest{Op: "renew", Resource: resource, Token: token, TTL: ttl})
}

func (p historyProcessStore) release(ctx context.Context, resource string, token int64) (leaseGrant, error) {
	return p.grant(ctx, historyWorkerRequest{Op: "release", Resource: resource, Token: token})
}

func (p historyProcessStore) write(ctx context.Context, w historyWrite) error {
	_, err := p.do(ctx, historyWorkerRequest{
		Op: "write", Resource: w.resource, Key: w.key, Value: w.value, Token: w.token, Leased: w.leased, Pause: w.pause != nil,
	}, w.pause)
	return err
}

func (p historyProcessStore) read(ctx context.Context, resource, key string) (string, int64, error) {
	r, err := p.do(ctx, historyWorkerRequest{Op: "read", Resource: resource, Key: key}, nil)
	return r.Value, r.Token, err
}

func (p historyProcessStore) leaseChecked(requested bool) bool {
	// The worker's store of the same variant decides; every variant's
	// choice is a pure function of its name and the request.
	s, err := historyStoreFor(p.variant, clientStore{})
	if err != nil {
		return requested
	}
	return s.leaseChecked(requested)
}

// serveHistoryWorker is the worker's main loop: it runs requests until
// stdin ends.
func serveHistoryWorker(t *testing.T, url string) {
	pool := pgtest.Connect(t, url, 1)
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	base := clientStore{pool: pool, client: client}
	continued := make(chan os.Signal, 1)
	signal.Notify(continued, syscall.SIGCONT)
	defer signal.Stop(continued)
	out := bufio.NewWriter(os.Stdout)
	send := func(r historyWorkerReply) {
		b, _ := json.Marshal(r)
		_, _ = out.WriteString(historyWorkerPrefix + string(b) + "\n")
		_ = out.Flush()
	}
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var req historyWorkerRequest
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			send(historyWorkerReply{Kind: "error", Err: fmt.Sprintf("unreadable request: %v", err)})
			continue
		}
		store, err := historyStoreFor(req.Variant, base)
		if err != nil {
			send(historyWorkerReply{Kind: "error", Err: err.Error()})
			continue
		}
		var r historyWorkerReply
		var g leaseGrant
		switch req.Op {
		case "acquire":
			g, err = store.acquire(ctx, req.Resource, req.Holder, req.TTL, nil)
		case "renew":
			g, err = store.renew(ctx, req.Resource, req.Token, req.TTL)
		case "release":
			g, err = store.release(ctx, req.Resource, req.Token)
		case "write":
			w := historyWrite{resource: req.Resource, key: req.Key, value: req.Value, token: req.Token, leased: req.Leased}
			if req.Pause {
				w.pause = func() {
					for len(continued) > 0 {
						<-continued
					}
					send(historyWorkerReply{Paused: true})
					// Wait to be stopped and continued. The bound only
					// keeps an abandoned worker from hanging.
					select {
					case <-continued:
					case <-time.After(time.Minute):
					}
				}
			}
			err = store.write(ctx, w)
		case "read":
			r.Value, r.Token, err = store.read(ctx, req.Resource, req.Key)
		default:
			err = fmt.Errorf("unknown op %q", req.Op)
		}
		if req.Op != "read" {
			r.Token, r.At, r.Expires = g.token, g.at, g.expires
		}
		switch {
		case err == nil:
		case errors.Is(err, lease.ErrHeld), quota.IsRetryable(err) && req.Op == "acquire":
			r.Kind = "held"
		case errors.Is(err, lease.ErrLost):
			r.Kind = "lost"
		case errors.Is(err, fence.ErrStaleToken):
			r.Kind = "stale"
		default:
			r.Kind = "error"
		}
		if err != nil {
			r.Err = err.Error()
		}
		send(r)
	}
}

// A holder that is a real process, stopped (SIGSTOP) in the middle of its
// work until its lease has expired and a successor has acquired it and
// written, has its write refused with ErrStaleToken when it is continued
// (SIGCONT), and the successor's value stays. Run with historyWorkerEnv
// set, this test is the worker process of the history harness.
func TestFenceHistoryStoppedProcessWriteIsRefused(t *testing.T) {
	if url := os.Getenv(historyWorkerEnv); url != "" {
		serveHistoryWorker(t, url)
		return
	}
	t.Parallel()
	url := pgtest.NewURL(t)
	pool := pgtest.Connect(t, url, 2)
	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	ctx := context.Background()
	w := startHistoryWorker(t, url)
	proc := historyProcessStore{w: w, variant: historyRealVariant}

	held, err := proc.acquire(ctx, "job", "proc", historyTTL, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	resumed := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		done <- proc.write(ctx, historyWrite{resource: "job", key: "out", value: "from the stopped process", token: held.token, leased: true, pause: func() {
			if err := w.stop(); err != nil {
				t.Error(err)
			}
			close(stopped)
			<-resumed
			if err := w.cont(); err != nil {
				t.Error(err)
			}
		}})
	}()
	<-stopped
	st, err := processState(w.pid())
	require.NoError(t, err)
	require.Equal(t, "T", st, "the worker must be stopped")

	var next lease.Lease
	require.Eventually(t, func() bool {
		next, err = leaseOf(t, client).Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "successor", TTL: time.Minute})
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "the stopped holder's lease must expire")
	require.Greater(t, next.Token, held.token)
	_, err = fenceOf(t, client).WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "out", Value: "from the successor", Token: next.Token, Lease: "job"})
	require.NoError(t, err)

	close(resumed)
	err = <-done
	require.ErrorIs(t, err, fence.ErrStaleToken)
	row, err := fenceOf(t, client).Row(ctx, "job", "out")
	require.NoError(t, err)
	require.Equal(t, "from the successor", row.Value)
	require.Equal(t, next.Token, row.Token)
}
