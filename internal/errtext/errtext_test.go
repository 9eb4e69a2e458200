package errtext

import (
	"errors"
	"testing"
)

func TestOnePrefixKeepsTheFirstAndQuotedNames(t *testing.T) {
	for in, want := range map[string]string{
		"pgquota: grant: pgquota: schema is missing":                  "pgquota: grant: schema is missing",
		"migrate up: pgquota: x: pgquota: y (pgquota: z; pgquota: w)": "migrate up: pgquota: x: y (z; w)",
		`pgquota: grant: member "pgquota: m" (ERROR: pgquota: bad)`:   `pgquota: grant: member "pgquota: m" (ERROR: bad)`,
		"no prefix at all":           "no prefix at all",
		"pgquota: one\npgquota: two": "pgquota: one\ntwo",
	} {
		if got := OnePrefix(in); got != want {
			t.Errorf("OnePrefix(%q) = %q, want %q", in, got, want)
		}
	}
	base := errors.New("pgquota: quota not found")
	err := Errorf("pgquota: grant: %w", base)
	if !errors.Is(err, base) || err.Error() != "pgquota: grant: quota not found" {
		t.Fatalf("Errorf: %q, Is %v", err, errors.Is(err, base))
	}
}
