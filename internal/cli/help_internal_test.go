package cli

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/bench"
)

// walk calls fn for cmd and every command below it.
func walk(cmd *cobra.Command, fn func(*cobra.Command)) {
	fn(cmd)
	for _, c := range cmd.Commands() {
		walk(c, fn)
	}
}

// pflag takes a back-quoted word in a flag's usage as the name of the
// flag's value ("--grant-id pgquota ledger show"), so no usage has one.
func TestFlagUsagesHaveNoBackquotes(t *testing.T) {
	t.Parallel()
	walk((&app{}).rootCommand(), func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			require.NotContains(t, f.Usage, "`", "%s --%s", c.CommandPath(), f.Name)
		}
		c.LocalFlags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
	})
}

// bench --help lists the strategies with their descriptions in one column,
// however long the longest name.
func TestBenchStrategyListAligned(t *testing.T) {
	t.Parallel()
	col := -1
	for _, line := range strings.Split(strings.TrimSuffix(strategyList(), "\n"), "\n") {
		name := strings.Fields(line)[0]
		i := strings.Index(line, name) + len(name)
		j := i + len(line[i:]) - len(strings.TrimLeft(line[i:], " "))
		require.GreaterOrEqual(t, j-i, 2, "%q", line)
		if col < 0 {
			col = j
		}
		require.Equal(t, col, j, "%q", line)
	}
}

// The bench says how long it will measure before it starts.
func TestBenchPlan(t *testing.T) {
	t.Parallel()
	grantHot, ok := bench.Lookup("grant-hot")
	require.True(t, ok)
	cfg := bench.Config{Strategies: []bench.Strategy{grantHot}, Clients: []int{8, 32}, Duration: 5 * time.Second, Rounds: 3, Pgbench: true}
	require.Equal(t, "pgquota bench: 1 strategy x 2 client counts x 5s x 3 rounds x 2 sides (library and pgbench) = 1m0s of measuring, plus setup", benchPlan(cfg))
	cfg = bench.Config{Clients: []int{1}, Duration: 2 * time.Second, Rounds: 1}
	require.Equal(t, fmt.Sprintf("pgquota bench: %d strategies x 1 client count x 2s x 1 round x 1 side (library only) = %s of measuring, plus setup",
		len(bench.Strategies()), time.Duration(len(bench.Strategies()))*2*time.Second), benchPlan(cfg))
}

// README's "Command line" section lists every command: a line that starts
// with "pgquota GROUP" names each of the group's subcommands.
func TestReadmeListsEveryCommand(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	readme := string(b)
	start := strings.Index(readme, "## Command line")
	require.Positive(t, start)
	section := readme[start:]
	section = section[:strings.Index(section[1:], "\n## ")+1]
	var lines []string
	for _, l := range strings.Split(section, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "pgquota ") {
			lines = append(lines, l)
		}
	}
	walk((&app{}).rootCommand(), func(c *cobra.Command) {
		if c.HasSubCommands() || c.Hidden || !c.Runnable() || c.Name() == "help" || c.Parent() == nil ||
			(c.Parent().Name() == "completion") {
			return
		}
		group := strings.TrimPrefix(c.Parent().CommandPath(), "pgquota")
		word := regexp.MustCompile(`(^|[ |(])` + regexp.QuoteMeta(c.Name()) + `($|[ |)])`)
		for _, l := range lines {
			if group == "" {
				if f := strings.Fields(l); len(f) > 1 && f[1] == c.Name() {
					return
				}
				continue
			}
			if rest, ok := strings.CutPrefix(l, "pgquota"+group+" "); ok && word.MatchString(rest) {
				return
			}
		}
		t.Errorf("README's command list has no line for %q", c.CommandPath())
	})
}
