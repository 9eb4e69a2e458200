package cli

import (
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
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
