package testbundle

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// replyDropper is a TCP proxy between a test's pool and PostgreSQL that can
// lose a reply after the server committed: when armed, it holds back the
// server's messages up to the next ReadyForQuery (which PostgreSQL sends
// after the implicit transaction of a statement has committed); if they
// include a CommandComplete, it discards them and cuts both connections,
// so the client never learns the outcome. Replies without a
// CommandComplete (a prepare, a ping) pass.
//
// With dropTag set, only a reply whose CommandComplete carries that command
// tag ("COMMIT", "INSERT 0 1") is dropped; the others pass.
// ReplyDropper is a TCP proxy that can lose a reply (see NewTagDropper);
// Armed arms it, Dropped receives once it dropped one.
type ReplyDropper struct {
	Ln      net.Listener
	target  string
	Armed   atomic.Bool
	dropTag string
	Dropped chan struct{}
}

func NewReplyDropper(t *testing.T, target string) *ReplyDropper {
	t.Helper()
	return NewTagDropper(t, target, "")
}

// NewTagDropper returns a ReplyDropper that drops only a reply with the
// command tag dropTag ("" for any).
func NewTagDropper(t *testing.T, target, dropTag string) *ReplyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &ReplyDropper{Ln: ln, target: target, dropTag: dropTag, Dropped: make(chan struct{}, 1)}
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
			go func() {
				_, _ = io.Copy(server, client)
				server.Close()
			}()
			go p.serverToClient(server, client)
		}
	}()
	return p
}

// serverToClient forwards the server's messages (a type byte and a length,
// from the first byte: the test connects without SSL) and drops a reply
// when armed.
func (p *ReplyDropper) serverToClient(server, client net.Conn) {
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
		if !p.Armed.Load() {
			if _, err := client.Write(msg); err != nil {
				return
			}
			continue
		}
		held = append(held, msg...)
		if msg[0] == 'C' && (p.dropTag == "" || string(bytes.TrimRight(msg[5:], "\x00")) == p.dropTag) {
			completed = true
		}
		if msg[0] != 'Z' {
			continue
		}
		if completed && p.Armed.CompareAndSwap(true, false) {
			p.Dropped <- struct{}{}
			return // the reply is lost; both connections are cut
		}
		if _, err := client.Write(held); err != nil {
			return
		}
		held, completed = held[:0], false
	}
}

// Settle waits until no other session of the test's database runs a
// statement: a statement whose client gave up (cancelled context, cut
// connection) may still be running, and commit, on the server.
func (b *Bundle) Settle(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := b.Pool.QueryRow(b.Ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND state NOT IN ('idle')`).Scan(&n)
		return err == nil && n == 0
	}, 30*time.Second, 10*time.Millisecond)
}
