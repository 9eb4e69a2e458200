// Package errtext keeps pgquota's error messages to exactly one "pgquota: "
// prefix. pgquota's sentinels (quota.ErrSchemaMissing, ...) and the errors
// of its inner layers start with "pgquota: " so that each reads well on
// its own; an error that wraps them with its own "pgquota: op: " would
// otherwise print the prefix twice ("pgquota: grant: pgquota: schema is
// missing ...").
package errtext

import (
	"fmt"
	"strings"
)

// Prefix starts every pgquota error message.
const Prefix = "pgquota: "

// Errorf is fmt.Errorf whose message keeps only the first "pgquota: " of
// the formatted text (OnePrefix). The wrapped errors stay in the chain
// unchanged: errors.Is and errors.As see them, their own messages included.
func Errorf(format string, args ...any) error {
	return &onePrefix{err: fmt.Errorf(format, args...)}
}

type onePrefix struct{ err error }

func (e *onePrefix) Error() string { return OnePrefix(e.err.Error()) }

func (e *onePrefix) Unwrap() error { return e.err }

// OnePrefix returns msg with every "pgquota: " after the first removed
// where it starts a part of the message: at the start of msg, or after
// ": ", "; ", "(" or a newline (so a name quoted in the message, such as
// a member "pgquota: x", is left alone).
func OnePrefix(msg string) string {
	first := strings.Index(msg, Prefix)
	if first < 0 {
		return msg
	}
	var b strings.Builder
	b.Grow(len(msg))
	b.WriteString(msg[:first+len(Prefix)])
	rest := msg[first+len(Prefix):]
	for {
		i := strings.Index(rest, Prefix)
		if i < 0 {
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:i])
		if out := b.String(); !strings.HasSuffix(out, ": ") && !strings.HasSuffix(out, "; ") &&
			!strings.HasSuffix(out, "(") && !strings.HasSuffix(out, "\n") {
			b.WriteString(Prefix)
		}
		rest = rest[i+len(Prefix):]
	}
}
