package quota_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// A linearizability check of the fenced lock: many clients acquire one
// lease, pause at random (some past the TTL), write fenced values and read
// them back. The history of acquisitions, writes and reads is checked with
// porcupine against a fenced register: a resource of two keys whose store
// admits a write only with a token at least as high as any acquired or
// written before it.

const historyKeys = 2

// fencedRegister is the model's state. It is comparable, so porcupine's
// default equality works, and Step never mutates it.
type fencedRegister struct {
	values  [historyKeys]string
	tokens  [historyKeys]int64
	highest int64
}

type opKind int

const (
	opAcquire opKind = iota
	opWrite
	opRead
)

type historyInput struct {
	kind  opKind
	key   int
	token int64
	value string
}

type writeOutcome int

const (
	writeOK    writeOutcome = iota
	writeStale              // ErrStaleToken
	writeLost               // ErrLeaseLost: the lease expired with this token
)

type historyOutput struct {
	token   int64        // acquire: the token; read: the value's token
	value   string       // read
	outcome writeOutcome // write
}

var fencedRegisterModel = porcupine.Model{
	Init: func() any { return fencedRegister{} },
	Step: func(state, input, output any) (bool, any) {
		s := state.(fencedRegister)
		in := input.(historyInput)
		out := output.(historyOutput)
		switch in.kind {
		case opAcquire:
			// Tokens strictly increase; a token acquired counts as seen.
			if out.token <= s.highest {
				return false, s
			}
			s.highest = out.token
			return true, s
		case opWrite:
			switch out.outcome {
			case writeOK:
				if in.token < s.highest {
					return false, s
				}
				s.values[in.key], s.tokens[in.key] = in.value, in.token
				s.highest = in.token
				return true, s
			case writeStale:
				return in.token < s.highest, s
			default: // writeLost: the holder's own lease lapsed
				return in.token >= s.highest, s
			}
		default:
			return out.value == s.values[in.key] && out.token == s.tokens[in.key], s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(historyInput), output.(historyOutput)
		switch in.kind {
		case opAcquire:
			return fmt.Sprintf("acquire -> %d", out.token)
		case opWrite:
			return fmt.Sprintf("write(k%d, %q, token %d) -> %v", in.key, in.value, in.token, []string{"ok", "stale", "lost"}[out.outcome])
		default:
			return fmt.Sprintf("read(k%d) -> %q@%d", in.key, out.value, out.token)
		}
	},
}

// writeFunc writes value under key with token; it returns the library's
// errors for a rejection.
type writeFunc func(ctx context.Context, key string, token int64, value string) error

// recordHistory runs the clients and returns their history.
func recordHistory(t *testing.T, b *testBundle, write writeFunc) []porcupine.Operation {
	t.Helper()
	const (
		clients = 6
		rounds  = 4
		ttl     = 100 * time.Millisecond
	)
	start := time.Now()
	stamp := func() int64 { return time.Since(start).Nanoseconds() }
	var mu sync.Mutex
	var history []porcupine.Operation
	var firstErr error
	record := func(client int, in historyInput, call int64, out historyOutput) {
		mu.Lock()
		defer mu.Unlock()
		history = append(history, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: stamp()})
	}
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	concurrently(clients, func(c int) {
		rng := rand.New(rand.NewPCG(uint64(c), uint64(start.UnixNano())))
		for r := range rounds {
			// Acquire: only the attempt that succeeds is recorded (a failed
			// one changes nothing).
			var l quota.Lease
			for {
				call := stamp()
				var err error
				l, err = b.client.Acquire(b.ctx, quota.AcquireRequest{Name: "reg", Holder: fmt.Sprint("client-", c), TTL: ttl})
				if err == nil {
					record(c, historyInput{kind: opAcquire}, call, historyOutput{token: l.Token})
					break
				}
				if !errors.Is(err, quota.ErrLeaseHeld) {
					fail(err)
					return
				}
				time.Sleep(time.Duration(2+rng.IntN(10)) * time.Millisecond)
			}
			// Pause: client 0 always sleeps past the TTL in its first round,
			// the others at random.
			switch {
			case c == 0 && r == 0, rng.IntN(4) == 0:
				time.Sleep(ttl + time.Duration(50+rng.IntN(150))*time.Millisecond)
			default:
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			}
			key := rng.IntN(historyKeys)
			value := fmt.Sprintf("c%d-r%d", c, r)
			call := stamp()
			err := write(b.ctx, fmt.Sprint("k", key), l.Token, value)
			out := historyOutput{outcome: writeOK}
			switch {
			case errors.Is(err, quota.ErrStaleToken):
				out.outcome = writeStale
			case errors.Is(err, quota.ErrLeaseLost):
				out.outcome = writeLost
			case err != nil:
				fail(err)
				return
			}
			record(c, historyInput{kind: opWrite, key: key, token: l.Token, value: value}, call, out)

			call = stamp()
			row, err := b.client.FencedRow(b.ctx, "reg", fmt.Sprint("k", key))
			if err != nil && !errors.Is(err, quota.ErrFencedRowNotFound) {
				fail(err)
				return
			}
			record(c, historyInput{kind: opRead, key: key}, call, historyOutput{value: row.Value, token: row.Token})

			if _, err := b.client.Release(b.ctx, "reg", l.Token); err != nil && !errors.Is(err, quota.ErrLeaseLost) {
				fail(err)
				return
			}
		}
	})
	require.NoError(t, firstErr)
	return history
}

func TestHistoryFencedIsLinearizable(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	history := recordHistory(t, b, func(ctx context.Context, key string, token int64, value string) error {
		_, err := b.client.FenceWrite(ctx, quota.FenceWriteRequest{Resource: "reg", Key: key, Value: value, Token: token, Lease: "reg"})
		return err
	})
	rejected := 0
	for _, op := range history {
		if op.Input.(historyInput).kind == opWrite && op.Output.(historyOutput).outcome != writeOK {
			rejected++
		}
	}
	require.Positive(t, rejected, "the history must include fenced-off writes")
	res := porcupine.CheckOperationsTimeout(fencedRegisterModel, history, time.Minute)
	require.Equal(t, porcupine.Ok, res, "%d operations", len(history))
}

// The same harness on a deliberately unfenced write (test-only: a plain
// upsert that ignores the token) is reported non-linearizable, which shows
// that the checker and the model can fail.
func TestHistoryUnfencedIsNotLinearizable(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	history := recordHistory(t, b, func(ctx context.Context, key string, token int64, value string) error {
		for {
			_, err := b.pool.Exec(ctx, `
				INSERT INTO pgquota.fenced_row (resource, key, value, fence_token, updated_at)
				VALUES ('reg', $1, $2, $3, clock_timestamp())
				ON CONFLICT (resource, key) DO UPDATE
				SET value = excluded.value, fence_token = excluded.fence_token, updated_at = excluded.updated_at`,
				key, value, token)
			// Under a SERIALIZABLE default isolation (CI's second pass) a
			// concurrent upsert of the key fails with 40001: run it again,
			// as pgquota's own calls do.
			if !quota.IsRetryable(err) {
				return err
			}
		}
	})
	res := porcupine.CheckOperationsTimeout(fencedRegisterModel, history, time.Minute)
	require.Equal(t, porcupine.Illegal, res, "a stale write landed, so the history must not be linearizable")
}
