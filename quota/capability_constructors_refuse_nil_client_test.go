package quota_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
	"github.com/pgquota/pgquota/quota/voucher"
)

// Every capability constructor refuses a nil quota.Client with a
// *quota.InputError naming "client" (quota.ErrInvalidInput), and returns
// no client; voucher.New also refuses a negative CodeClaimWait.
func TestCapabilityConstructorsRefuseNilClientWithInputError(t *testing.T) {
	t.Parallel()
	for name, newFn := range map[string]func() (any, error){
		"lease.New":   func() (any, error) { return lease.New(nil) },
		"fence.New":   func() (any, error) { return fence.New(nil) },
		"outbox.New":  func() (any, error) { return outbox.New(nil) },
		"voucher.New": func() (any, error) { return voucher.New(nil, &voucher.Config{CodeClaimWait: -1}) },
	} {
		c, err := newFn()
		require.ErrorIs(t, err, quota.ErrInvalidInput, name)
		var in *quota.InputError
		require.True(t, errors.As(err, &in), name)
		require.Equal(t, "client", in.Field, name)
		require.True(t, isNilClient(c), "%s returned %#v", name, c)
	}
}

func isNilClient(c any) bool {
	switch c := c.(type) {
	case *lease.Client:
		return c == nil
	case *fence.Client:
		return c == nil
	case *outbox.Client:
		return c == nil
	case *voucher.Client:
		return c == nil
	}
	return false
}
