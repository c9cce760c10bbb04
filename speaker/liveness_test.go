package speaker

import (
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/ownership"
)

// TestLiveness: /healthz passes while the ownership lock can be taken and
// the health loop polls; it fails, saying why, when the lock is held for
// ever or the loop stopped polling; a loop that has not started yet is not
// stuck.
func TestLiveness(t *testing.T) {
	own := newOwners(logr.Discard(), "a", ownership.Options{}, nil, newMetrics(nil), nil)
	h := &health{}
	l := newLiveness(own, h)
	l.lockWait, l.stuckAfter = 50*time.Millisecond, time.Second
	if err := l.check(nil); err != nil {
		t.Fatalf("a health loop that has not polled yet: %v", err)
	}
	h.lastPoll.Store(time.Now().UnixNano())
	if err := l.check(nil); err != nil {
		t.Fatalf("a loop that just polled: %v", err)
	}
	h.lastPoll.Store(time.Now().Add(-2 * time.Second).UnixNano())
	if err := l.check(nil); err == nil || !strings.Contains(err.Error(), "no poll") {
		t.Fatalf("a loop silent for 2 s (stuckAfter 1 s): %v", err)
	}
	h.lastPoll.Store(time.Now().UnixNano())
	own.mu.Lock()
	err := l.check(nil)
	own.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "ownership lock") {
		t.Fatalf("the ownership lock held: %v", err)
	}
	if err := newLiveness(own, nil).check(nil); err != nil {
		t.Fatalf("without memberlist (no health loop): %v", err)
	}
}
