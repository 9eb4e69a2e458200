package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Relay, inspect and write transactional outbox events",
		Long: `The outbox holds events written in the same transaction as a grant
(quota.Client.EnqueueTx), so an event exists if and only if its grant
committed. A relay delivers them at least once: consumers dedupe by the
event id.`,
	}
	cmd.AddCommand(a.outboxRelayCommand(), a.outboxStatusCommand(), a.outboxEnqueueCommand(), a.outboxReapCommand())
	return cmd
}

func (a *app) outboxRelayCommand() *cobra.Command {
	var cfg quota.RelayConfig
	var execCmd string
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
PGQUOTA_IDEMPOTENCY_SCOPE, PGQUOTA_IDEMPOTENCY_KEY, PGQUOTA_FENCING_TOKEN.
Exit status 0 marks the event delivered; anything else is a failure, retried
with backoff, and after --max-attempts failures the event is dead.

Delivery is at least once: dedupe by the event id. Several relays may run at
once; no event is delivered by two of them at the same time.`,
		Example: `  pgquota outbox relay --topic grant.made --exec './notify.sh'
  pgquota outbox relay --once > events.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			h := a.jsonLineHandler()
			if execCmd != "" {
				h = execHandler(execCmd)
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
			var total quota.BatchResult
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
	return cmd
}

// relayLine is an event as `outbox relay` writes it to stdout.
type relayLine struct {
	ID               int64           `json:"id"`
	Topic            string          `json:"topic"`
	Payload          json.RawMessage `json:"payload,omitempty"`
	PayloadBase64    []byte          `json:"payload_base64,omitempty"`
	GrantID          int64           `json:"grant_id,omitempty"`
	IdempotencyScope string          `json:"idempotency_scope,omitempty"`
	IdempotencyKey   string          `json:"idempotency_key,omitempty"`
	FencingToken     int64           `json:"fencing_token,omitempty"`
	Attempt          int             `json:"attempt"`
	CreatedAt        time.Time       `json:"created_at"`
}

// jsonLineHandler writes each event as one JSON line to stdout.
func (a *app) jsonLineHandler() quota.Handler {
	var mu sync.Mutex
	return func(_ context.Context, ev quota.Event) error {
		line := relayLine{
			ID: ev.ID, Topic: ev.Topic, GrantID: ev.GrantID, IdempotencyScope: ev.IdempotencyScope,
			IdempotencyKey: ev.IdempotencyKey, FencingToken: ev.FencingToken, Attempt: ev.Attempt, CreatedAt: ev.CreatedAt,
		}
		if json.Valid(ev.Payload) {
			line.Payload = ev.Payload
		} else {
			line.PayloadBase64 = ev.Payload
		}
		b, err := json.Marshal(line)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		_, err = a.stdout.Write(append(b, '\n'))
		return err
	}
}

// execHandler runs command through sh -c per event.
func execHandler(command string) quota.Handler {
	return func(ctx context.Context, ev quota.Event) error {
		cmd := exec.CommandContext(ctx, "sh", "-c", command)
		cmd.Stdin = bytes.NewReader(ev.Payload)
		cmd.Env = append(os.Environ(),
			"PGQUOTA_EVENT_ID="+strconv.FormatInt(ev.ID, 10),
			"PGQUOTA_EVENT_TOPIC="+ev.Topic,
			"PGQUOTA_EVENT_ATTEMPT="+strconv.Itoa(ev.Attempt),
			"PGQUOTA_GRANT_ID="+strconv.FormatInt(ev.GrantID, 10),
			"PGQUOTA_IDEMPOTENCY_SCOPE="+ev.IdempotencyScope,
			"PGQUOTA_IDEMPOTENCY_KEY="+ev.IdempotencyKey,
			"PGQUOTA_FENCING_TOKEN="+strconv.FormatInt(ev.FencingToken, 10),
		)
		var stderr bytes.Buffer
		cmd.Stdout = io.Discard
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			msg := strings.TrimSpace(stderr.String())
			if msg == "" {
				return err
			}
			return fmt.Errorf("%w: %s", err, msg)
		}
		return nil
	}
}

func (a *app) outboxStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Count outbox events by state, and show the lag (age of the oldest pending event)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			st, err := c.OutboxStatus(cmd.Context())
			if err != nil {
				return err
			}
			out := struct {
				Pending    int64     `json:"pending"`
				Retrying   int64     `json:"retrying"`
				Delivered  int64     `json:"delivered"`
				Dead       int64     `json:"dead"`
				LagSeconds float64   `json:"lag_seconds"`
				At         time.Time `json:"at"`
			}{st.Pending, st.Retrying, st.Delivered, st.Dead, st.Lag.Seconds(), st.At}
			return a.output(out, func(w *tabwriter.Writer) {
				row(w, "pending", st.Pending)
				row(w, "retrying", st.Retrying)
				row(w, "delivered", st.Delivered)
				row(w, "dead", st.Dead)
				row(w, "lag", st.Lag.Round(time.Millisecond))
			})
		},
	}
}

func (a *app) outboxEnqueueCommand() *cobra.Command {
	var topic, payload, file string
	var opts quota.EnqueueOpts
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
			c, err := a.quotaClient(cmd.Context())
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
			c, err := a.quotaClient(cmd.Context())
			if err != nil {
				return err
			}
			n, err := c.ReapOutbox(cmd.Context(), olderThan)
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
