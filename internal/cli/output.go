package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"
)

// output prints v as JSON with --json, else calls text with an aligned
// writer that is flushed afterwards.
func (a *app) output(v any, text func(w *tabwriter.Writer)) error {
	if a.json {
		b, err := jsonValue(v, "  ")
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(b)
		return err
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

// zeroTime is how encoding/json spells a zero time.Time.
const zeroTime = "0001-01-01T00:00:00Z"

// jsonValue encodes v for --json with every field present: a time that is
// not set (a zero time.Time, such as the window of a quota without one)
// becomes null, so scripts can rely on each key of a command's output
// being there, as false, 0, "" or null. Keys come out sorted. indent ""
// gives one line.
func jsonValue(v any, indent string) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", indent)
	if err := enc.Encode(nullZeroTimes(tree)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func nullZeroTimes(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = nullZeroTimes(e)
		}
	case []any:
		for i, e := range v {
			v[i] = nullZeroTimes(e)
		}
	case string:
		if v == zeroTime {
			return nil
		}
	}
	return v
}
