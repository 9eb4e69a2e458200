// Command etcdfence is the recipe for fencing an application table with an
// etcd lock: take etcd's concurrency.Mutex on a session lease, make the
// lock key's create revision the holder's fencing token, and present it to
// pgquota's fence guard, attached to the table for external tokens
// (`pgquota fence guard --table T --column C --external`, or
// fence.GuardTableRequest{External: true}). Every statement on the table
// then lands only in a transaction that presented a token no lower than any
// presented before, so a holder whose lease expired while it was paused
// finds its late write refused (fence.ErrStaleToken, SQLSTATE PQ001) instead
// of overwriting its successor's.
//
//	pgquota fence guard --table public.reports --column fence_token --external
//	go run ./examples/etcdfence --etcd http://127.0.0.1:2379 --database-url "$DATABASE_URL" \
//	    --lock /locks/reports --table public.reports --id 1 --value 42 --epoch 1
//
// The token is fence.ExternalToken(epoch, revision, fence.EtcdRevisionBits):
// (epoch << 40) + revision. Revisions go back when etcd is restored from a
// snapshot (3.4 has no way to bump them on restore) and start again on a new
// cluster: bump --epoch then (every client the same), or every new holder is
// refused as stale. The table needs columns id (int), value (bigint) and
// the guard's token column.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "etcdfence:", err)
		if errors.Is(err, fence.ErrStaleToken) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("etcdfence", flag.ContinueOnError)
	endpoints := fs.String("etcd", "http://127.0.0.1:2379", "etcd endpoints, comma-separated")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL database with pgquota's schema")
	lockPrefix := fs.String("lock", "/locks/reports", "the lock's etcd key prefix")
	table := fs.String("table", "public.reports", "the guarded table (attached with --external)")
	id := fs.Int("id", 1, "the row to write")
	value := fs.Int64("value", 0, "the value to write")
	epoch := fs.Int64("epoch", 1, "token epoch: bump it when etcd's revisions restart (restore, new cluster)")
	ttl := fs.Int("ttl", 10, "the session lease's TTL in seconds")
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	h, err := Lock(ctx, cli, *lockPrefix, *ttl, *epoch)
	if err != nil {
		return err
	}
	defer func() { _ = h.Unlock(context.WithoutCancel(ctx)) }()
	if err := h.Write(ctx, pool, qc, *table, *id, *value); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s id %d = %d with token %d (epoch %d, create revision %d)\n", *table, *id, *value, h.Token, *epoch, h.Revision)
	return nil
}

// Holder is a held etcd lock and the fencing token it gives.
type Holder struct {
	// Revision is the lock key's create revision.
	Revision int64
	// Token is fence.ExternalToken(epoch, Revision, fence.EtcdRevisionBits).
	Token int64

	session *concurrency.Session
	mutex   *concurrency.Mutex
}

// Lock takes the lock under prefix with a session lease of ttl seconds (it
// waits for the lock until ctx ends) and returns its holder with the token
// of epoch.
func Lock(ctx context.Context, cli *clientv3.Client, prefix string, ttl int, epoch int64) (*Holder, error) {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(s, prefix)
	if err := m.Lock(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	// The create revision of our key, read only while we still own it.
	r, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpGet(m.Key())).Commit()
	if err == nil && (!r.Succeeded || len(r.Responses[0].GetResponseRange().Kvs) == 0) {
		err = errors.New("etcd: the lock's key is gone: the lease expired")
	}
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	rev := r.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	token, err := fence.ExternalToken(epoch, rev, fence.EtcdRevisionBits)
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	return &Holder{Revision: rev, Token: token, session: s, mutex: m}, nil
}

// Write sets value on row id of the guarded table in one transaction that
// first presents the holder's token (quota.Client.PresentTokenTx, or in SQL
// SELECT pgquota.present_token('public.reports', token)). The guard's
// resource is the table's schema-qualified name.
//
// Errors: fence.ErrStaleToken when a later holder has presented a higher
// token; those of PresentTokenTx and of the UPDATE (fence.MapError maps
// the guard's SQLSTATEs).
func (h *Holder) Write(ctx context.Context, pool *pgxpool.Pool, qc *fence.Client, table string, id int, value int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := qc.PresentTokenTx(ctx, tx, fence.PresentTokenRequest{Resource: table, Token: h.Token}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+pgx.Identifier(strings.Split(table, ".")).Sanitize()+` SET value = $2 WHERE id = $1`, id, value)
		return fence.MapError(err)
	})
}

// Unlock deletes the lock key and revokes the session's lease (nothing to
// delete once the lease expired).
func (h *Holder) Unlock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return errors.Join(h.mutex.Unlock(ctx), h.session.Close())
}
