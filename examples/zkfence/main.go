// Command zkfence is the recipe for fencing pgquota rows with a ZooKeeper
// lock: take the lock with ZooKeeper's recipe (an ephemeral sequential node
// under the lock's node; the lowest sequence number holds it), make the
// holder's sequence number its fencing token, and write through pgquota's
// fenced rows, which refuse a token below the highest they have seen. A
// holder whose session expired while it was paused (a GC pause, a stopped
// process, a partition) then finds its late write refused
// (fence.ErrStaleToken) instead of overwriting its successor's.
//
//	go run ./examples/zkfence --zookeeper 127.0.0.1:2181 --database-url "$DATABASE_URL" \
//	    --lock /locks/report --resource report --key total --value 42 --epoch 1
//
// The token is fence.ExternalToken(epoch, seq, fence.ZooKeeperSeqBits):
// (epoch << 32) + seq. Sequence numbers restart at 0 on a new ensemble, and
// when the lock's node is deleted and created again: bump --epoch then (every
// client the same), or every new holder is refused as stale. The database
// must have pgquota's migrations (pgquota migrate up).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "zkfence:", err)
		if errors.Is(err, fence.ErrStaleToken) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("zkfence", flag.ContinueOnError)
	addr := fs.String("zookeeper", "127.0.0.1:2181", "ZooKeeper server(s), comma-separated host:port")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL database with pgquota's schema")
	lockPath := fs.String("lock", "/locks/report", "the lock's ZooKeeper node (used by this lock only)")
	resource := fs.String("resource", "report", "the pgquota fenced resource the lock protects")
	key := fs.String("key", "total", "the fenced row to write")
	value := fs.String("value", "", "the value to write")
	epoch := fs.Int64("epoch", 1, "token epoch: bump it when the ensemble's sequence numbers restart")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	q, err := quota.New(pool, nil)
	if err != nil {
		return err
	}
	qc, err := fence.New(q)
	if err != nil {
		return err
	}
	conn, _, err := zk.Connect(strings.Split(*addr, ","), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := WaitSession(ctx, conn, 30*time.Second); err != nil {
		return err
	}
	h, err := Lock(conn, *lockPath, *epoch)
	if err != nil {
		return err
	}
	defer func() { _ = h.Unlock() }()
	row, err := h.Write(ctx, qc, *resource, *key, *value)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s/%s = %q with token %d (epoch %d, sequence %d)\n", row.Resource, row.Key, row.Value, row.Token, *epoch, h.Seq)
	return nil
}

// WaitSession waits up to timeout until conn holds a session with a
// server. zk.Connect returns at once and connects in the background; a
// request sent before the first connection is made fails with
// zk.ErrNoServer ("zk: could not connect to a server") when that attempt
// fails, as it can on a busy machine, while the client keeps trying.
func WaitSession(ctx context.Context, conn *zk.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for conn.State() != zk.StateHasSession {
		select {
		case <-ctx.Done():
			return fmt.Errorf("zookeeper %s: no session after %s (state %s)", conn.Server(), timeout, conn.State())
		case <-tick.C:
		}
	}
	return nil
}

// Holder is a held ZooKeeper lock and the fencing token it gives.
type Holder struct {
	// Seq is the holder's lock node's sequence number.
	Seq int64
	// Token is fence.ExternalToken(epoch, Seq, fence.ZooKeeperSeqBits).
	Token int64
	// Node is the holder's lock node.
	Node string

	lock *zk.Lock
}

// Lock takes the lock at lockPath with go-zookeeper's lock recipe (it
// waits for the lock) and returns its holder with the token of epoch.
func Lock(conn *zk.Conn, lockPath string, epoch int64) (*Holder, error) {
	l := zk.NewLock(conn, lockPath, zk.WorldACL(zk.PermAll))
	if err := l.Lock(); err != nil {
		return nil, err
	}
	seq, node, err := heldSeq(conn, lockPath)
	if err != nil {
		_ = l.Unlock()
		return nil, err
	}
	token, err := fence.ExternalToken(epoch, seq, fence.ZooKeeperSeqBits)
	if err != nil {
		_ = l.Unlock()
		return nil, err
	}
	return &Holder{Seq: seq, Token: token, Node: node, lock: l}, nil
}

// heldSeq returns the sequence number of the lock node conn's session
// holds: the lowest child of lockPath, which must be owned by this session
// (zk.Lock keeps its node's name to itself; after an expiry the lowest child
// is the next holder's, so the owner check matters).
func heldSeq(conn *zk.Conn, lockPath string) (int64, string, error) {
	children, _, err := conn.Children(lockPath)
	if err != nil {
		return 0, "", err
	}
	best, bestSeq := "", int64(-1)
	for _, name := range children {
		i := strings.LastIndex(name, "lock-")
		if i < 0 {
			continue
		}
		s, err := strconv.ParseInt(name[i+len("lock-"):], 10, 64)
		if err == nil && (bestSeq < 0 || s < bestSeq) {
			best, bestSeq = name, s
		}
	}
	if best == "" {
		return 0, "", errors.New("zookeeper: the lock has no node: the session expired")
	}
	node := lockPath + "/" + best
	_, st, err := conn.Get(node)
	if err != nil {
		return 0, "", err
	}
	if st.EphemeralOwner != conn.SessionID() {
		return 0, "", errors.New("zookeeper: the lock's lowest node is another session's: this session expired")
	}
	return bestSeq, node, nil
}

// Write writes value to the fenced row (resource, key) with the holder's
// token: admitted only while no higher token has written to resource. A
// read-modify-write should first raise the resource's mark with a write of
// its own (any key) before it reads, so that a holder paused since its read
// is refused even before its successor writes the row.
//
// Errors: fence.ErrStaleToken when a later holder's token has written;
// those of fence.Client.WriteRow.
func (h *Holder) Write(ctx context.Context, qc *fence.Client, resource, key, value string) (fence.Row, error) {
	return qc.WriteRow(ctx, fence.WriteRowRequest{Resource: resource, Key: key, Value: value, Token: h.Token})
}

// Unlock deletes the holder's lock node (nothing to delete once its session
// expired).
func (h *Holder) Unlock() error { return h.lock.Unlock() }
