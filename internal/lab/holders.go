package lab

import (
	"sort"
	"time"
)

// Hold is a span of time during which a request believed it held the
// lock: from the moment its lock call reported success to the moment it
// began to release it or, if earlier, the end of the validity its lock
// service promised (Redlock's validity time).
type Hold struct {
	From, Until time.Time
}

// overlaps counts the moments with two holders or more among holds: the
// maximal spans of time during which at least two requests believed they
// held the lock, and their total length. Holds that only touch (one ends
// as the next begins) do not overlap.
func overlaps(holds []Hold) (moments int64, total time.Duration) {
	type edge struct {
		at    time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(holds))
	for _, h := range holds {
		if h.Until.After(h.From) {
			edges = append(edges, edge{h.From, +1}, edge{h.Until, -1})
		}
	}
	// Ends before starts at the same instant: touching is not overlapping.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].at.Before(edges[j].at)
	})
	var (
		active int
		since  time.Time
	)
	for _, e := range edges {
		was := active
		active += e.delta
		switch {
		case was < 2 && active >= 2:
			moments++
			since = e.at
		case was >= 2 && active < 2:
			total += e.at.Sub(since)
		}
	}
	return moments, total
}
