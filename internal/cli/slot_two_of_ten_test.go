package cli_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// The shell check: a 2-slot concurrency limit with 10 concurrent
// acquirers has 2 holders. Ten `pgquota slot acquire --limit 2` run at once
// (each its own Client and pool, as ten processes would be): exactly 2 exit
// 0 with distinct slots 0 and 1 and distinct tokens, 8 exit 3 printing
// acquired false and 2 holders, with one line on stderr; `slot show` lists
// exactly the 2 holders. Then release (twice: harmless), renew of the
// released slot (exit 3), a new acquire (exit 0 on the freed slot), and bad
// input (exit 2 naming the field).
func TestCLISlotTwoOfTenConcurrentAcquirersHold(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	type acquired struct {
		Acquired bool  `json:"acquired"`
		Slot     int   `json:"slot"`
		Token    int64 `json:"token"`
		Holders  int   `json:"holders"`
	}
	var wg sync.WaitGroup
	results := make([]result, 10)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runDB(t, dbURL, "slot", "acquire", "--name", "enc", "--limit", "2", "--ttl", "1m",
				"--holder", fmt.Sprintf("p%d", i), "--json")
		}()
	}
	wg.Wait()
	tokens := map[int64]int{}
	slots := map[int]bool{}
	denied := 0
	for i, r := range results {
		var a acquired
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &a), "p%d: %q %q", i, r.stdout, r.stderr)
		switch r.code {
		case cli.ExitOK:
			require.True(t, a.Acquired)
			tokens[a.Token] = a.Slot
			slots[a.Slot] = true
		case cli.ExitDenied:
			denied++
			require.False(t, a.Acquired)
			require.Equal(t, 2, a.Holders)
			require.Regexp(t, `^pgquota: semaphore "enc" is full: 2 held, limit 2 .*\n$`, r.stderr)
		default:
			t.Fatalf("p%d: exit %d: %s", i, r.code, r.stderr)
		}
	}
	require.Len(t, tokens, 2, "two holders, two tokens")
	require.Equal(t, map[int]bool{0: true, 1: true}, slots)
	require.Equal(t, 8, denied)

	var shown struct {
		Limit   int `json:"limit"`
		Holders int `json:"holders"`
		Slots   []struct {
			Slot  int   `json:"slot"`
			Token int64 `json:"token"`
			Held  bool  `json:"held"`
		} `json:"slots"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, dbURL, "slot", "show", "--name", "enc", "--json")), &shown))
	require.Equal(t, 2, shown.Holders)
	require.Equal(t, 2, shown.Limit)
	require.Len(t, shown.Slots, 2)
	for _, s := range shown.Slots {
		require.True(t, s.Held)
		require.Equal(t, s.Slot, tokens[s.Token], "slot %d's token %d", s.Slot, s.Token)
	}
	require.Regexp(t, `(?m)^held\s+2 of 2$`, ok(t, dbURL, "slot", "show", "--name", "enc"))

	var tok0 int64
	for tok, slot := range tokens {
		if slot == 0 {
			tok0 = tok
		}
	}
	release := []string{"slot", "release", "--name", "enc", "--slot", "0", "--token", fmt.Sprint(tok0)}
	ok(t, dbURL, release...)
	ok(t, dbURL, release...)
	r := runDB(t, dbURL, "slot", "renew", "--name", "enc", "--slot", "0", "--token", fmt.Sprint(tok0))
	require.Equal(t, cli.ExitDenied, r.code, r.stderr)
	require.Contains(t, r.stderr, "lease lost")

	var again acquired
	require.NoError(t, json.Unmarshal([]byte(ok(t, dbURL, "slot", "acquire", "--name", "enc", "--limit", "2", "--json")), &again))
	require.Equal(t, 0, again.Slot)
	require.Greater(t, again.Token, tok0)

	for _, tc := range []struct{ flag, value, field string }{
		{"--limit", "0", "invalid limit"},
		{"--limit", "-3", "invalid limit"},
		{"--ttl", "0s", "invalid ttl"},
		{"--name", "", "invalid semaphore"},
	} {
		args := []string{"slot", "acquire", "--name", "bad", "--limit", "2"}
		args = append(args, tc.flag, tc.value)
		requireError(t, runDB(t, dbURL, args...), cli.ExitUsage, tc.field)
	}
	r = runDB(t, dbURL, "slot", "show", "--name", "bad")
	require.Equal(t, cli.ExitError, r.code, "bad input wrote no semaphore: %s", r.stderr)
	require.Contains(t, r.stderr, "semaphore not found")
}
