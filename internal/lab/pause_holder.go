package lab

import (
	"context"
	"strings"
	"time"

	"github.com/pgquota/pgquota/internal/netpause"
)

// pauseHolder is the lab's GC pause for a lock-service client: the first
// Config.Paused requests that get here sleep d with their connections to
// the lock service blackholed. It reports whether the caller paused.
func (f *Faults) pauseHolder(ctx context.Context, d time.Duration, b *netpause.Blackhole) bool {
	if d <= 0 || f.n.Add(1) > f.paused {
		return false
	}
	b.Hold()
	defer b.Release()
	sleep(ctx, d)
	return true
}

// oneLine is err's text on one line (a server's log tail joined with " | "),
// at most 400 bytes, for a strategy's unavailable reason.
func oneLine(err error) string {
	s := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " | ")), " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}
