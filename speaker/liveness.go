package speaker

import (
	"fmt"
	"net/http"
	"time"
)

// The speaker's /healthz says whether its ownership machinery still makes
// progress, not only whether the process answers HTTP: a speaker whose
// ownership loop is wedged (a deadlock, a call that never returns) would
// otherwise keep its IPs answered by its responders while deciding nothing,
// for ever. The kubelet restarts a speaker whose /healthz fails; its IPs are
// held meanwhile (its kernel answers its watchers), as for any restart.
const (
	// lockWait: the ownership lock is taken for microseconds to a few
	// milliseconds (a takeover of 1,250 IPs: ~10 ms); not obtaining it for
	// this long means it is held by something that does not return.
	lockWait = 5 * time.Second
	// stuckAfter: the health loop completes a poll every 50 ms, each taking
	// the ownership lock; none for this long means it is wedged. Far above
	// any starvation seen in the lab (a few seconds at 5,000 Services on
	// 2 cores), so a busy speaker is not restarted.
	stuckAfter = 20 * time.Second
)

// liveness is the speaker's /healthz check.
type liveness struct {
	own *owners
	// health is nil without memberlist.
	health *health
	// lockWait and stuckAfter: the constants above (tests shorten them).
	lockWait, stuckAfter time.Duration
}

func newLiveness(own *owners, health *health) *liveness {
	return &liveness{own: own, health: health, lockWait: lockWait, stuckAfter: stuckAfter}
}

// check fails when the ownership lock cannot be taken within lockWait, or
// the health loop has completed no poll for stuckAfter.
func (l *liveness) check(*http.Request) error {
	if !l.own.lockable(l.lockWait) {
		return fmt.Errorf("the ownership lock has been held for over %v: the ownership loop is stuck", l.lockWait)
	}
	if l.health != nil {
		if age, started := l.health.sinceLastPoll(time.Now()); started && age > l.stuckAfter {
			return fmt.Errorf("the health loop completed no poll for %v (every 50 ms when working): the ownership loop is stuck", age.Round(time.Second))
		}
	}
	return nil
}

// lockable reports whether the ownership lock can be taken within d. A lock
// that is never released leaves one goroutine waiting per call, until the
// kubelet restarts the speaker.
func (o *owners) lockable(d time.Duration) bool {
	got := make(chan struct{})
	go func() {
		o.mu.Lock()
		o.mu.Unlock() //nolint:staticcheck // an empty critical section: only whether it can be entered
		close(got)
	}()
	select {
	case <-got:
		return true
	case <-time.After(d):
		return false
	}
}
