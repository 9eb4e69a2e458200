package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/pgquota/pgquota/quota/outbox"
	"github.com/spf13/cobra"
)

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Relay, inspect and write transactional outbox events",
		Long: `The outbox holds events written in the same transaction as a grant
(outbox.Client.EnqueueTx), so an event exists if and only if its grant
committed. A relay delivers them at least once: consumers dedupe by the
event id.`,
	}
	cmd.AddCommand(a.outboxRelayCommand(), a.outboxStatusCommand(), a.outboxListCommand(), a.outboxEnqueueCommand(), a.outboxReapCommand())
	return cmd
}

func (a *app) outboxRelayCommand() *cobra.Command {
	var cfg outbox.RelayConfig
	var execCmd, metricsAddr string
	var once bool
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Deliver outbox events: as JSON lines on stdout, or to a command (--exec)",
		Long: `Deliver outbox events until interrupted (or, with --once, until none is due).

Without --exec, each event is written to stdout as one JSON line (id, topic,
payload as JSON when it is JSON, else payload_base64, grant_id, ...); the
event counts as delivered once the line is written.

With --exec, the command runs through sh -c once per event, with the payload
on stdin and the event in the environment: PGQUOTA_EVENT_ID,
PGQUOTA_EVENT_TOPIC, PGQUOTA_EVENT_ATTEMPT, PGQUOTA_GRANT_ID,
PGQUOTA_IDEMPOTENCY_SCOPE, PGQUOTA_IDEMPOTENCY_KEY, PGQUOTA_FENCING_TOKEN
(empty when the event has none). Exit status 0 marks the event delivered;
anything else is a failure, retried with backoff, and after --max-attempts
failures the event is dead. The command's stdout and stderr go to the
relay's stderr, each line prefixed with "pgquota: event ID (TOPIC): "; a
failure is reported there with the exit status and the last lines of the
command's stderr, which are also stored as the event's last error
('pgquota outbox list' shows them).

Delivery is at least once: dedupe by the event id. Several relays may run at
once; no event is delivered by two of them at the same time.`,
		Example: `  pgquota outbox relay --topic grant.made --exec './notify.sh'
  pgquota outbox relay --once > events.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := a.startMetrics(metricsAddr)
			if err != nil {
				return err
			}
			defer ms.stop()
			qc, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			ms.ready(qc)
			c, err := outbox.New(qc)
			if err != nil {
				return err
			}
			h := a.jsonLineHandler()
			if execCmd != "" {
				h = a.execHandler(execCmd, cmp.Or(cfg.MaxAttempts, 10))
			}
			cfg.OnError = func(err error) {
				fmt.Fprintln(a.stderr, "pgquota: relay: "+oneLine(strings.TrimPrefix(err.Error(), "pgquota: ")))
			}
			r, err := c.NewRelay(h, cfg)
			if err != nil {
				return err
			}
			if !once {
				return r.Run(cmd.Context())
			}
			var total outbox.BatchResult
			for {
				res, err := r.RunOnce(cmd.Context())
				if err != nil {
					return err
				}
				total.Claimed += res.Claimed
				total.Delivered += res.Delivered
				total.Failed += res.Failed
				total.Dead += res.Dead
				if res.Claimed == 0 || cmd.Context().Err() != nil {
					break
				}
			}
			summary := fmt.Sprintf("delivered %d, failed %d, dead %d", total.Delivered, total.Failed, total.Dead)
			if execCmd == "" {
				// stdout carries the events.
				fmt.Fprintln(a.stderr, "pgquota: "+summary)
				return nil
			}
			return a.output(total, func(w *tabwriter.Writer) {
				row(w, "delivered", total.Delivered)
				row(w, "failed", total.Failed)
				row(w, "dead", total.Dead)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Topics, "topic", nil, "deliver only events of these topics (repeatable; default all)")
	f.StringVar(&execCmd, "exec", "", "deliver each event by running this shell command (see above)")
	f.BoolVar(&once, "once", false, "deliver the events that are due, then exit")
	f.IntVar(&cfg.BatchSize, "batch-size", 100, "events claimed per transaction")
	f.DurationVar(&cfg.PollInterval, "poll-interval", time.Second, "wait this long when no event is due")
	f.IntVar(&cfg.MaxAttempts, "max-attempts", 10, "failed deliveries after which an event is dead")
	f.DurationVar(&cfg.RetryInitial, "retry-initial", time.Second, "wait before retrying a failed event (doubles per failure)")
	f.DurationVar(&cfg.RetryMax, "retry-max", 10*time.Minute, "longest wait before retrying a failed event")
	metricsAddrFlag(cmd, &metricsAddr)
	return cmd
}

// relayLine is an event as `outbox relay` writes it to stdout.
type relayLine struct {
	ID               int64           `json:"id"`
	Topic            string          `json:"topic"`
	Payload          json.RawMessage `json:"payload"`
	PayloadBase64    []byte          `json:"payload_base64"`
	GrantID          int64           `json:"grant_id"`
	IdempotencyScope string          `json:"idempotency_scope"`
	IdempotencyKey   string          `json:"idempotency_key"`
	FencingToken     int64           `json:"fencing_token"`
	Attempt          int             `json:"attempt"`
	CreatedAt        time.Time       `json:"created_at"`
}

// jsonLineHandler writes each event as one JSON line to stdout.
func (a *app) jsonLineHandler() outbox.Handler {
	var mu sync.Mutex
	return func(_ context.Context, ev outbox.Event) error {
		line := relayLine{
			ID: ev.ID, Topic: ev.Topic, GrantID: ev.GrantID, IdempotencyScope: ev.IdempotencyScope,
			IdempotencyKey: ev.IdempotencyKey, FencingToken: ev.FencingToken, Attempt: ev.Attempt, CreatedAt: ev.CreatedAt,
		}
		if json.Valid(ev.Payload) {
			line.Payload = ev.Payload
		} else {
			line.PayloadBase64 = ev.Payload
		}
		b, err := jsonValue(line, "")
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		_, err = a.stdout.Write(b)
		return err
	}
}

// execHandler runs command through sh -c per event, with the payload on
// stdin and the event in the environment. Its output goes to the relay's
// stderr, each line prefixed with the event; a failure is reported there
// too, with the exit status and the tail of the command's stderr (or of
// its stdout, when stderr was empty), which is also the event's last_error.
func (a *app) execHandler(command string, maxAttempts int) outbox.Handler {
	var mu sync.Mutex // one line at a time on stderr
	return func(ctx context.Context, ev outbox.Event) error {
		cmd := exec.CommandContext(ctx, "sh", "-c", command)
		cmd.Stdin = bytes.NewReader(ev.Payload)
		cmd.Env = append(os.Environ(),
			"PGQUOTA_EVENT_ID="+strconv.FormatInt(ev.ID, 10),
			"PGQUOTA_EVENT_TOPIC="+ev.Topic,
			"PGQUOTA_EVENT_ATTEMPT="+strconv.Itoa(ev.Attempt),
			"PGQUOTA_GRANT_ID="+optional(ev.GrantID),
			"PGQUOTA_IDEMPOTENCY_SCOPE="+ev.IdempotencyScope,
			"PGQUOTA_IDEMPOTENCY_KEY="+ev.IdempotencyKey,
			"PGQUOTA_FENCING_TOKEN="+optional(ev.FencingToken),
		)
		// A command that leaves a background process holding its output
		// open does not stall the relay.
		cmd.WaitDelay = 5 * time.Second
		name := fmt.Sprintf("event %d (%s)", ev.ID, ev.Topic)
		out := &prefixWriter{mu: &mu, w: a.stderr, prefix: "pgquota: " + name + ": "}
		errOut := &prefixWriter{mu: &mu, w: a.stderr, prefix: "pgquota: " + name + ": "}
		var outTail, errTail tailBuffer
		cmd.Stdout = io.MultiWriter(out, &outTail)
		cmd.Stderr = io.MultiWriter(errOut, &errTail)
		err := cmd.Run()
		out.flush()
		errOut.flush()
		if err == nil {
			return nil
		}
		reason := err.Error()
		if tail := errTail.lastLines(); tail != "" {
			reason += ": " + tail
		} else if tail := outTail.lastLines(); tail != "" {
			reason += ": " + tail
		}
		var next string
		switch {
		case ctx.Err() != nil:
			next = "interrupted: it stays pending"
		case ev.Attempt >= maxAttempts:
			next = fmt.Sprintf("attempt %d of %d: dead now, see pgquota outbox list --state dead", ev.Attempt, maxAttempts)
		default:
			next = fmt.Sprintf("attempt %d of %d: retried later", ev.Attempt, maxAttempts)
		}
		mu.Lock()
		fmt.Fprintf(a.stderr, "pgquota: %s failed: %s; %s\n", name, oneLine(reason), next)
		mu.Unlock()
		return errors.New(reason)
	}
}

// optional spells an optional number for the environment: empty for 0
// (not set).
func optional(v int64) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatInt(v, 10)
}

// prefixWriter writes whole lines to w, each with prefix, under mu.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

// maxLine is where prefixWriter breaks a line that has no end.
const maxLine = 64 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			if len(p.buf) >= maxLine {
				p.emit(p.buf)
				p.buf = p.buf[:0]
			}
			return len(b), nil
		}
		p.emit(p.buf[:i])
		p.buf = p.buf[i+1:]
	}
}

func (p *prefixWriter) emit(line []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s%s\n", p.prefix, bytes.TrimRight(line, "\r"))
}

// flush writes a last line that had no newline.
func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		p.emit(p.buf)
		p.buf = nil
	}
}

// tailBuffer keeps the last few KiB written to it.
type tailBuffer struct{ b []byte }

const tailBytes = 4 << 10

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.b = append(t.b, b...)
	if len(t.b) > 2*tailBytes {
		t.b = append(t.b[:0], t.b[len(t.b)-tailBytes:]...)
	}
	return len(b), nil
}

// lastLines returns the last three non-empty lines, joined with " / ", at
// most about 1000 bytes: the reason a command gives when it fails.
func (t *tailBuffer) lastLines() string {
	var lines []string
	for _, l := range strings.Split(string(t.b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	s := strings.Join(lines, " / ")
	if len(s) > 1000 {
		s = "..." + strings.ToValidUTF8(s[len(s)-1000:], "")
	}
	return s
}

func (a *app) outboxStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Count outbox events by state, and show the lag (age of the oldest pending event)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.outboxClient(cmd.Context())
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			return a.output(st, func(w *tabwriter.Writer) {
				row(w, "pending", st.Pending)
				row(w, "retrying", st.Retrying)
				row(w, "delivered", st.Delivered)
				row(w, "dead", st.Dead)
				row(w, "lag", st.Lag.Round(time.Millisecond))
			})
		},
	}
}

func (a *app) outboxListCommand() *cobra.Command {
	var f outbox.Filter
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List outbox events with their state, attempts and last error (default: the failed ones)",
		Long: `List outbox events in id order with their state, attempts and the error of
their last failed attempt. --state picks them: failed (the default: every
event whose last attempt failed, retrying or dead), retrying (pending after
a failure), dead (failed --max-attempts times, never delivered again),
pending, delivered, or all. At most --limit events; --after-id ID pages on.

With --json each event includes its payload (as JSON when it is JSON, else
payload_base64).`,
		Example: `  pgquota outbox list --state dead
  pgquota outbox list --state all --topic grant.made --limit 20 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.State == "all" {
				f.State = ""
			}
			c, err := a.outboxClient(cmd.Context())
			if err != nil {
				return err
			}
			evs, err := c.Events(cmd.Context(), f)
			if err != nil {
				return err
			}
			type listLine struct {
				ID               int64           `json:"id"`
				Topic            string          `json:"topic"`
				Payload          json.RawMessage `json:"payload"`
				PayloadBase64    []byte          `json:"payload_base64"`
				GrantID          int64           `json:"grant_id"`
				IdempotencyScope string          `json:"idempotency_scope"`
				IdempotencyKey   string          `json:"idempotency_key"`
				FencingToken     int64           `json:"fencing_token"`
				CreatedAt        time.Time       `json:"created_at"`
				State            string          `json:"state"`
				Attempts         int             `json:"attempts"`
				LastError        string          `json:"last_error"`
				NextAttemptAt    time.Time       `json:"next_attempt_at"`
				FinishedAt       time.Time       `json:"finished_at"`
			}
			lines := make([]listLine, len(evs))
			for i, ev := range evs {
				lines[i] = listLine{
					ID: ev.ID, Topic: ev.Topic, GrantID: ev.GrantID, IdempotencyScope: ev.IdempotencyScope,
					IdempotencyKey: ev.IdempotencyKey, FencingToken: ev.FencingToken, CreatedAt: ev.CreatedAt,
					State: ev.State, Attempts: ev.Attempts, LastError: ev.LastError,
					NextAttemptAt: ev.NextAttemptAt, FinishedAt: ev.FinishedAt,
				}
				if json.Valid(ev.Payload) {
					lines[i].Payload = ev.Payload
				} else {
					lines[i].PayloadBase64 = ev.Payload
				}
			}
			return a.output(lines, func(w *tabwriter.Writer) {
				if len(lines) == 0 {
					row(w, "(no events)")
					return
				}
				row(w, "ID", "TOPIC", "STATE", "ATTEMPTS", "CREATED", "LAST ERROR")
				for _, l := range lines {
					state := l.State
					if l.State == outbox.StatePending && l.LastError != "" {
						state = "retrying"
					}
					lastErr := "-"
					if l.LastError != "" {
						lastErr = oneLine(l.LastError)
					}
					row(w, l.ID, l.Topic, state, l.Attempts, stamp(l.CreatedAt), lastErr)
				}
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.State, "state", outbox.StateFailed, "failed, retrying, dead, pending, delivered or all")
	fl.StringSliceVar(&f.Topics, "topic", nil, "only events of these topics (repeatable; default all)")
	fl.Int64Var(&f.AfterID, "after-id", 0, "only events with a higher id (to page on)")
	fl.IntVar(&f.Limit, "limit", 100, "list at most this many events (up to 10000)")
	return cmd
}

func (a *app) outboxEnqueueCommand() *cobra.Command {
	var topic, payload, file string
	var opts outbox.EnqueueOpts
	cmd := &cobra.Command{
		Use:   "enqueue",
		Short: "Write one event to the outbox (for operators and tests; applications use EnqueueTx)",
		Example: `  pgquota outbox enqueue --topic grant.made --payload '{"order": 1234}' --grant-id 42
  pgquota outbox enqueue --topic mail --payload-file message.eml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("payload") == cmd.Flags().Changed("payload-file") {
				return usagef("give exactly one of --payload and --payload-file")
			}
			body := []byte(payload)
			if file != "" {
				var err error
				if file == "-" {
					body, err = io.ReadAll(cmd.InOrStdin())
				} else {
					body, err = os.ReadFile(file)
				}
				if err != nil {
					return usagef("--payload-file: %v", err)
				}
			}
			c, err := a.outboxClient(cmd.Context())
			if err != nil {
				return err
			}
			id, err := c.Enqueue(cmd.Context(), topic, body, &opts)
			if err != nil {
				return err
			}
			out := struct {
				ID    int64  `json:"id"`
				Topic string `json:"topic"`
			}{id, topic}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "id", id)
				row(w, "topic", topic)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&topic, "topic", "", "event topic (required)")
	f.StringVar(&payload, "payload", "", "event payload")
	f.StringVar(&file, "payload-file", "", "read the payload from this file (- for stdin)")
	f.Int64Var(&opts.GrantID, "grant-id", 0, "stamp the event with this grant id")
	f.StringVar(&opts.IdempotencyScope, "idempotency-scope", "", "stamp the event with this idempotency scope")
	f.StringVar(&opts.IdempotencyKey, "idempotency-key", "", "stamp the event with this idempotency key")
	f.Int64Var(&opts.FencingToken, "fencing-token", 0, "stamp the event with this fencing token")
	_ = cmd.MarkFlagRequired("topic")
	return cmd
}

func (a *app) outboxReapCommand() *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:     "reap",
		Short:   "Delete delivered and dead events that finished more than --older-than ago",
		Example: `  pgquota outbox reap --older-than 168h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.outboxClient(cmd.Context())
			if err != nil {
				return err
			}
			n, err := c.Reap(cmd.Context(), olderThan)
			if err != nil {
				return err
			}
			out := struct {
				Deleted int64 `json:"deleted"`
			}{n}
			return a.output(out, func(w *tabwriter.Writer) { row(w, "deleted", n) })
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "delete events finished longer ago than this (required)")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

// outboxClient is the outbox client on quotaClient's pool and settings.
func (a *app) outboxClient(ctx context.Context) (*outbox.Client, error) {
	c, err := a.quotaClient(ctx)
	if err != nil {
		return nil, err
	}
	return outbox.New(c)
}
