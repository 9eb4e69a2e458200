package cli_test

import (
	"strings"
	"testing"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
)

// quota define with a length out of Definition.Period's bounds (--window,
// --rolling, or the period of --rate) exits 2 with one line naming the flag
// and the value as given, and defines nothing.
func TestQuotaDefineLengthNamesFlag(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--window", "0s", "--limit", "1"}, []string{`--window "0s"`, "at least 1ms", "got 0s"}},
		{[]string{"--window", "-5m", "--limit", "1"}, []string{`--window "-5m"`, "at least 1ms"}},
		{[]string{"--window", "500us", "--limit", "1"}, []string{`--window "500us"`, "at least 1ms"}},
		{[]string{"--window", "1500us", "--limit", "1"}, []string{`--window "1500us"`, "whole number of milliseconds"}},
		{[]string{"--window", "876601h", "--limit", "1"}, []string{`--window "876601h"`, "at most 36525 days"}},
		{[]string{"--rolling", "0s", "--limit", "1"}, []string{`--rolling "0s"`, "at least 1ms"}},
		{[]string{"--rolling", "-1h", "--limit", "1"}, []string{`--rolling "-1h"`, "at least 1ms"}},
		{[]string{"--rate", "5/100us"}, []string{`--rate "5/100us"`, "at least 1ms"}},
		{[]string{"--rate", "5/900000h"}, []string{`--rate "5/900000h"`, "at most 36525 days"}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runDB(t, dbURL, append([]string{"quota", "define", "--name", "bad"}, c.args...)...)
			requireError(t, r, cli.ExitUsage, c.want...)
			if strings.Contains(r.stderr, "-1ns") || strings.Contains(r.stderr, "invalid period") {
				t.Errorf("stderr %q shows the internal placeholder", r.stderr)
			}
		})
	}
	out := ok(t, dbURL, "quota", "list", "--json")
	if strings.Contains(out, `"bad"`) {
		t.Errorf("a quota was defined: %s", out)
	}
}
