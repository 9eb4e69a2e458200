package cli_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
)

// statementReplyDropper is a TCP proxy that loses the reply of the first
// statement whose text contains marker, after the server committed it: once
// the client has sent the marker, the server's next messages up to
// ReadyForQuery are held and, when they complete a statement, discarded,
// and both connections are cut.
type statementReplyDropper struct {
	ln      net.Listener
	marker  []byte
	seen    atomic.Bool
	dropped atomic.Bool
}

func newStatementReplyDropper(t *testing.T, target, marker string) *statementReplyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &statementReplyDropper{ln: ln, marker: []byte(marker)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go p.clientToServer(client, server)
			go p.serverToClient(server, client)
		}
	}()
	return p
}

func (p *statementReplyDropper) clientToServer(client, server net.Conn) {
	defer server.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if !p.dropped.Load() && bytes.Contains(buf[:n], p.marker) {
				p.seen.Store(true)
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *statementReplyDropper) serverToClient(server, client net.Conn) {
	defer client.Close()
	defer server.Close()
	var held []byte
	completed := false
	for {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(server, hdr); err != nil {
			return
		}
		msg := make([]byte, 1+binary.BigEndian.Uint32(hdr[1:]))
		copy(msg, hdr)
		if _, err := io.ReadFull(server, msg[5:]); err != nil {
			return
		}
		if !p.seen.Load() || p.dropped.Load() {
			if _, err := client.Write(msg); err != nil {
				return
			}
			continue
		}
		held = append(held, msg...)
		completed = completed || msg[0] == 'C'
		if msg[0] != 'Z' {
			continue
		}
		if completed && p.dropped.CompareAndSwap(false, true) {
			return // the reply is lost; both connections are cut
		}
		if _, err := client.Write(held); err != nil {
			return
		}
		held, completed = held[:0], false
	}
}

// A grant whose reply is lost after it committed exits with
// ExitOutcomeUnknown and a line that says the grant may have been applied
// and how to learn it; the grant is in the counter.
func TestGrantOutcomeUnknownExit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"without a key", []string{"grant", "--quota", "lim", "--member", "m"},
			[]string{"outcome unknown: the grant may have been applied", "--idempotency-key", "pgquota usage"}},
		{"with a key", []string{"grant", "--quota", "lim", "--member", "m", "--idempotency-key", "order-7"},
			[]string{"outcome unknown: the grant may have been applied", "repeat with --idempotency-key order-7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := migratedURL(t)
			u, err := url.Parse(dbURL)
			require.NoError(t, err)
			marker := "-- name: UsageGrant :one"
			if len(tc.args) > 5 {
				marker = "-- name: LedgerGrant :one"
			}
			proxy := newStatementReplyDropper(t, u.Host, marker)
			u.Host = proxy.ln.Addr().String()

			r := runDB(t, u.String(), tc.args...)
			require.True(t, proxy.dropped.Load(), "the proxy lost the grant's reply; the run: %+v", r)
			requireError(t, r, cli.ExitOutcomeUnknown, tc.want...)

			out := ok(t, dbURL, "usage", "--quota", "lim", "--member", "m")
			require.Regexp(t, regexp.MustCompile(`(?m)^used\s+1$`), out, "the grant committed")
		})
	}
}
