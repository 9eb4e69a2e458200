package fence_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// TestExternalTokenEpochOrdersAboveNumbers: every token of epoch e+1 is
// above every token of epoch e, the extremes map exactly, and every
// out-of-range argument is ErrInvalidInput naming its field.
func TestExternalTokenEpochOrdersAboveNumbers(t *testing.T) {
	t.Parallel()
	top, err := fence.ExternalToken(1, 1<<40-1, fence.EtcdRevisionBits)
	require.NoError(t, err)
	bottom, err := fence.ExternalToken(2, 0, fence.EtcdRevisionBits)
	require.NoError(t, err)
	require.Equal(t, int64(1<<41), bottom)
	require.Less(t, top, bottom)
	zk0, err := fence.ExternalToken(1, 0, fence.ZooKeeperSeqBits)
	require.NoError(t, err)
	require.Equal(t, int64(1<<32), zk0)
	maxTok, err := fence.ExternalToken(1<<23-1, 1<<40-1, fence.EtcdRevisionBits)
	require.NoError(t, err)
	require.Equal(t, int64(math.MaxInt64), maxTok)

	for _, tc := range []struct {
		epoch, n int64
		bits     uint
		field    string
	}{
		{1, 0, 0, "bits"},
		{1, 0, 63, "bits"},
		{0, 5, 40, "epoch"},
		{1 << 23, 5, 40, "epoch"},
		{1, -1, 40, "external number"},
		{1, 1 << 40, 40, "external number"},
		{1, 1 << 32, fence.ZooKeeperSeqBits, "external number"},
	} {
		_, err := fence.ExternalToken(tc.epoch, tc.n, tc.bits)
		require.ErrorIs(t, err, quota.ErrInvalidInput, "%+v", tc)
		var ie *quota.InputError
		require.True(t, errors.As(err, &ie))
		require.Equal(t, tc.field, ie.Field, "%+v", tc)
	}
}
