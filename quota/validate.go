package quota

import (
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes is the longest quota name, member, campaign or voucher code
// accepted, in bytes of UTF-8.
const MaxNameBytes = 255

// MaxUnits is the largest amount, limit or pool total accepted: 2^62 - 1.
// With both an amount and a counter at most MaxUnits, their sum (at most
// 2^63 - 2) never overflows PostgreSQL's bigint (at most 2^63 - 1).
const MaxUnits int64 = 1<<62 - 1

// checkName validates an identifier-like argument: a quota name, member,
// campaign or code. It must be non-empty, at most MaxNameBytes bytes of valid
// UTF-8, and free of control characters (NUL included: PostgreSQL text
// cannot hold it).
func checkName(field, v string) error {
	switch {
	case v == "":
		return inputError(field, "must not be empty")
	case len(v) > MaxNameBytes:
		return inputError(field, "is %d bytes long, the limit is %d", len(v), MaxNameBytes)
	case !utf8.ValidString(v):
		return inputError(field, "is not valid UTF-8")
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return inputError(field, "must not contain control characters (found %U)", r)
		}
	}
	return nil
}

// checkUnits validates a count of units: an amount (min 1), a limit (min 0)
// or a pool total (min 1).
func checkUnits(field string, v, min int64) error {
	switch {
	case v < min:
		return inputError(field, "must be at least %d, got %d", min, v)
	case v > MaxUnits:
		return inputError(field, "must be at most %d, got %d", MaxUnits, v)
	}
	return nil
}
