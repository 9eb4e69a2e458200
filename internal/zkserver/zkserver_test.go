package zkserver_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/zkserver"
)

// TestStartServesAndStopsByPid: a started server answers a real client
// (create, read back), and Stop ends the very process it started.
func TestStartServesAndStopsByPid(t *testing.T) {
	s := zkserver.StartTB(t, zkserver.Options{})
	c, _, err := zk.Connect([]string{s.Addr}, 2*time.Second, zk.WithLogInfo(false))
	require.NoError(t, err)
	defer c.Close()
	// The server answers; the client makes its session in the background.
	require.Eventually(t, func() bool { return c.State() == zk.StateHasSession }, time.Minute, 10*time.Millisecond,
		"no session with %s", s.Addr)
	_, err = c.Create("/pgquota-zkserver-test", []byte("x"), 0, zk.WorldACL(zk.PermAll))
	require.NoError(t, err)
	b, _, err := c.Get("/pgquota-zkserver-test")
	require.NoError(t, err)
	require.Equal(t, "x", string(b))

	pid := s.Pid()
	s.Stop()
	require.True(t, errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), "process %d still exists after Stop", pid)
}
