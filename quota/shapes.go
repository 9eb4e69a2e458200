package quota

import (
	"strconv"
	"strings"
	"time"

	"github.com/pgquota/pgquota/internal/core"
)

// The constructors below spell the four kinds of quota as the command
// does (pgquota quota define --window, --rolling, --rate), so a Definition
// reads the same in Go and in a shell script. They check nothing:
// DefineQuota checks the Definition they return, with the errors it
// documents. Set TimeZone, Origin or ReplaceKind on the result where they
// apply.

// CalendarWindow is a counter per calendar window (WindowHour, WindowDay,
// WindowWeek, WindowMonth; WindowNone: one lifetime counter), cut in the
// IANA time zone timeZone ("" is UTC), limit units per member and window:
// the command's --window day --tz Europe/Berlin --limit 1000.
func CalendarWindow(name string, w Window, timeZone string, limit int64) Definition {
	return Definition{Name: name, Window: w, TimeZone: timeZone, DefaultLimit: Limit(limit)}
}

// FixedWindow is a counter per fixed window of the given length (whole
// milliseconds, 1ms to 36525 days), cut at the Unix epoch + k * length
// unless Origin is set: the command's --window 10s --limit 50.
func FixedWindow(name string, length time.Duration, limit int64) Definition {
	return Definition{Name: name, Window: WindowFixed, Period: length, DefaultLimit: Limit(limit)}
}

// RollingWindow is at most limit units in any period of the given length
// (whole milliseconds; limit at most MaxRollingLimit): the command's
// --rolling 1h --limit 100.
func RollingWindow(name string, length time.Duration, limit int64) Definition {
	return Definition{Name: name, Window: WindowRolling, Period: length, DefaultLimit: Limit(limit)}
}

// Rate is count units per period, at most burst at once (0: count),
// decided by GCRA: the command's --rate 10/s --burst 20 is
// Rate("api", 10, time.Second, 20). ParseRate reads the command's N/period.
func Rate(name string, count int64, per time.Duration, burst int64) Definition {
	return Definition{Name: name, Window: WindowRate, Period: per, DefaultLimit: Limit(count), Burst: burst}
}

// ParseRate parses a rate as the command's --rate takes it: N/s, N/m, N/h,
// N/d or N/<duration> (10/s, 600/m, 5/10s), into its count and period. It
// returns an *InputError (ErrInvalidInput) naming "rate" when s is not of
// that form or N is below 1; the period's bounds are DefineQuota's.
func ParseRate(s string) (count int64, per time.Duration, err error) {
	num, unit, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, core.Invalid("rate", "%q is not N/period such as 10/s or 5/10s", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, 0, core.Invalid("rate", "%q is not a whole number of units", num)
	}
	if n <= 0 {
		return 0, 0, core.Invalid("rate", "the rate must be at least 1 unit per period, got %d", n)
	}
	units := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}
	if d, ok := units[unit]; ok {
		return n, d, nil
	}
	d, err := time.ParseDuration(unit)
	if err != nil || d <= 0 {
		return 0, 0, core.Invalid("rate", "period %q is not s, m, h, d or a length such as 10s", unit)
	}
	return n, d, nil
}
