package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

// shapeFlags are quota define's flags for the kinds rate, fixed and
// rolling: --rate N/period, --burst, --rolling length, --origin (fixed
// windows; --window then holds a length).
type shapeFlags struct {
	rate, rolling, origin string
	burst                 int64
}

func (f *shapeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.rate, "rate", "", "a rate: N/s, N/m, N/h, N/d or N/<duration> (e.g. 10/s, 5/10s), decided by GCRA")
	cmd.Flags().Int64Var(&f.burst, "burst", 0, "with --rate: the most units granted at once (default: the rate's count)")
	cmd.Flags().StringVar(&f.rolling, "rolling", "", "a rolling window's length (e.g. 1h): at most --limit units in any period that long")
	cmd.Flags().StringVar(&f.origin, "origin", "", "with --window <length>: where windows are cut, RFC 3339 (default 1970-01-01T00:00:00Z)")
}

var calendarWindows = map[string]bool{"hour": true, "day": true, "week": true, "month": true, "none": true}

// apply sets def's kind and shape from the flags and --window.
func (f *shapeFlags) apply(cmd *cobra.Command, window string, def *quota.Definition) error {
	ch := cmd.Flags().Changed
	kinds := 0
	for _, n := range []string{"window", "rate", "rolling"} {
		if ch(n) {
			kinds++
		}
	}
	if kinds != 1 {
		return usagef("give exactly one of --window, --rolling and --rate")
	}
	if ch("burst") && !ch("rate") {
		return usagef("--burst needs --rate")
	}
	switch {
	case ch("rate"):
		if ch("limit") {
			return usagef("--rate gives the limit (N of N/period): leave out --limit")
		}
		n, per, err := parseRate(f.rate)
		if err != nil {
			return usagef("--rate %q: %v", f.rate, err)
		}
		if err := checkLength("--rate", f.rate, per); err != nil {
			return err
		}
		if ch("burst") && f.burst < 1 {
			// 0 would mean the default in quota.Definition: refuse here,
			// with the value as given.
			return usagef("--burst must be at least 1, got %d", f.burst)
		}
		def.Window, def.Period, def.DefaultLimit, def.Burst = quota.WindowRate, per, &n, f.burst
	case ch("rolling"):
		d, err := time.ParseDuration(f.rolling)
		if err != nil {
			return usagef("--rolling %q: not a length such as 30s, 1h or 36h", f.rolling)
		}
		if err := checkLength("--rolling", f.rolling, d); err != nil {
			return err
		}
		def.Window, def.Period = quota.WindowRolling, d
	case calendarWindows[window]:
		def.Window = quota.Window(window)
	default:
		d, err := time.ParseDuration(window)
		if err != nil {
			return usagef("--window %q: not one of hour, day, week, month, none, nor a length such as 10s, 15m, 36h", window)
		}
		if err := checkLength("--window", window, d); err != nil {
			return err
		}
		def.Window, def.Period = quota.WindowFixed, d
	}
	if ch("origin") {
		if def.Window != quota.WindowFixed {
			return usagef("--origin needs --window with a length (such as 10s or 36h)")
		}
		t, err := time.Parse(time.RFC3339Nano, f.origin)
		if err != nil {
			return usagef("--origin %q: not an RFC 3339 instant such as 2026-01-05T06:00:00Z", f.origin)
		}
		def.Origin = t
	}
	return nil
}

// checkLength checks a period given by flag (value as typed) against
// Definition.Period's bounds, naming the flag and the value: a whole
// number of milliseconds from 1ms to 36525 days.
func checkLength(flag, value string, d time.Duration) error {
	const most = 36525 * 24 * time.Hour
	switch {
	case d < time.Millisecond:
		return usagef("%s %q: the length must be at least 1ms, got %s", flag, value, d)
	case d > most:
		return usagef("%s %q: the length must be at most 36525 days (876600h), got %s", flag, value, d)
	case d%time.Millisecond != 0:
		return usagef("%s %q: the length must be a whole number of milliseconds, got %s", flag, value, d)
	}
	return nil
}

// parseRate parses --rate with quota.ParseRate, the library's one parser
// of N/period, and gives its reason without the library's prefix (the
// caller names the flag).
func parseRate(s string) (int64, time.Duration, error) {
	n, per, err := quota.ParseRate(s)
	var ie *quota.InputError
	if errors.As(err, &ie) {
		return 0, 0, errors.New(ie.Reason)
	}
	return n, per, err
}

// shapeRows prints a quota's shape (quota define, single quota).
func shapeRows(w *tabwriter.Writer, q quota.Quota) {
	switch q.Window {
	case quota.WindowRate:
		row(w, "period", q.Period)
		row(w, "burst", q.Burst)
	case quota.WindowFixed:
		row(w, "length", q.Period)
		row(w, "origin", stamp(q.Origin))
	case quota.WindowRolling:
		row(w, "length", q.Period)
	}
}

// limitRows prints a grant's retry-after and reset-after (every decided
// grant has them), and what pgquota.grant_limits adds: the refusing quota
// and each quota's outcome.
func limitRows(w *tabwriter.Writer, res quota.GrantResult) {
	if len(res.Limits) == 0 && res.DecidedAt.IsZero() {
		return
	}
	row(w, "retry after", waitText(res.RetryAfter))
	row(w, "reset after", waitText(res.ResetAfter))
	if res.DeniedBy != "" {
		row(w, "denied by", res.DeniedBy)
	}
	if len(res.Limits) > 1 {
		for _, l := range res.Limits {
			row(w, "limit "+l.Quota, fmt.Sprintf("%s: fits %s, used %d of %d, remaining %d, retry after %s",
				l.Window, yesNo(l.Fits), l.Used, l.Limit, l.Remaining, waitText(l.RetryAfter)))
		}
	}
}

func waitText(d time.Duration) string {
	if d == quota.Never {
		return "never"
	}
	return d.String()
}
