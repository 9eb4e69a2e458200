package lab_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/lab"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// The Redis URL's password must not show in the report (printed by
// `pgquota lab`, as text or JSON): neither in what was injected nor in the
// reason Redis is unavailable, nor when the URL does not parse.
func TestBreakLabRedisPasswordNotInReport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Connect(t, pgtest.BaseURL(t), 2)
	for _, u := range []string{
		"redis://:hunter2@127.0.0.1:1/0",
		"redis://user:hunter2@127.0.0.1:1/0",
		"redis://:hunter2@127.0.0.1:notaport/0",
	} {
		cfg := lab.DefaultConfig()
		cfg.Requests = 2
		cfg.RedisURL = u
		cfg.Strategies = []string{"redis-lock"}
		cfg.Pause = 0
		pgtest.Reserve(t, cfg.Requests+2, "the lab's requests and its pool")
		rep, err := lab.Run(ctx, admin, cfg)
		if err != nil {
			require.NotContains(t, err.Error(), "hunter2", u)
			continue
		}
		out, err := json.Marshal(rep)
		require.NoError(t, err)
		require.NotContains(t, string(out), "hunter2", u)
	}
}
