package bench

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

type fakeStrategy struct{ name string }

func (f fakeStrategy) Name() string                         { return f.name }
func (fakeStrategy) Describe() string                       { return "fake" }
func (fakeStrategy) Setup(context.Context, Env) (Op, error) { return Op{}, nil }

// TestRegisterReplacesPending is how the fenced lock plugs in. It is not
// parallel: parallel tests start after it, with the registry restored.
func TestRegisterReplacesPending(t *testing.T) {
	registry.Lock()
	saved, savedPending := slices.Clone(registry.strategies), slices.Clone(registry.pending)
	registry.Unlock()
	t.Cleanup(func() {
		registry.Lock()
		registry.strategies, registry.pending = saved, savedPending
		registry.Unlock()
	})

	Register(fakeStrategy{name: "lease-acquire"})
	s, ok := Lookup("lease-acquire")
	require.True(t, ok)
	require.Equal(t, "fake", s.Describe())
	require.Equal(t, "lease-acquire", Strategies()[len(Strategies())-1].Name())
	require.Equal(t, []Pending{{Name: "fenced-write", Reason: savedPending[1].Reason}}, PendingStrategies())
	require.Panics(t, func() { Register(fakeStrategy{name: "grant-hot"}) })
}
