package testbundle

import (
	"sync"
	"testing"
)

// ErrList collects errors from goroutines.
type ErrList struct {
	mu   sync.Mutex
	n    int
	errs []error
}

// Add records err (nil counts as a call that succeeded).
func (l *ErrList) Add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if err != nil {
		l.errs = append(l.errs, err)
	}
}

// RequireNone fails t when any call failed, naming the first error.
func (l *ErrList) RequireNone(t *testing.T, what string) {
	t.Helper()
	if len(l.errs) > 0 {
		t.Errorf("%s: %d of %d calls failed, first: %v", what, len(l.errs), l.n, l.errs[0])
	}
}
