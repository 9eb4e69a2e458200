package etcdserver_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pgquota/pgquota/internal/etcdserver"
)

// TestStartServesAndStopsByPid: a started server answers a real client
// (put, get back), and Stop ends the very process it started.
func TestStartServesAndStopsByPid(t *testing.T) {
	s := etcdserver.StartTB(t, etcdserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Put(ctx, "k", "v")
	require.NoError(t, err)
	r, err := c.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, r.Kvs, 1)
	require.Equal(t, "v", string(r.Kvs[0].Value))

	pid := s.Pid()
	s.Stop()
	require.True(t, errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), "process %d still exists after Stop", pid)
}
