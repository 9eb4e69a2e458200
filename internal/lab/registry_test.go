package lab

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

type fakeStrategy struct{ conditional }

func (fakeStrategy) Name() string { return "fenced" }

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

	require.Contains(t, Names(), "fenced")
	Register(func() Strategy { return fakeStrategy{} })
	require.Empty(t, pendingStrategies())
	all := Strategies()
	require.Equal(t, "fenced", all[len(all)-1].Name())
	require.Equal(t, []string{"no-lock", "naive-lock", "redis-lock", "conditional", "fenced"}, Names())
	require.Panics(t, func() { Register(func() Strategy { return noLock{} }) })
	// Each call makes new instances: concurrent labs share no state.
	require.NotSame(t, Strategies()[2], Strategies()[2])
}
