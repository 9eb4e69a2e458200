package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"
)

// output prints v as JSON with --json, else calls text with an aligned
// writer that is flushed afterwards.
func (a *app) output(v any, text func(w *tabwriter.Writer)) error {
	if a.json {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	text(w)
	return w.Flush()
}

// row writes one aligned line of cells.
func row(w *tabwriter.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(w, "\t")
		}
		fmt.Fprint(w, c)
	}
	fmt.Fprintln(w)
}

// yesNo spells a boolean for text output.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// stamp formats a time for text output; the zero time (an unbounded
// window edge) is "-".
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// window formats a window's bounds.
func window(start, end time.Time) string {
	if start.IsZero() && end.IsZero() {
		return "lifetime (no window)"
	}
	return stamp(start) + " .. " + stamp(end)
}
