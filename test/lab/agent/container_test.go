package agent

import (
	"testing"
	"time"
)

// TestRestartWait follows a container through crashes: the first restart is
// immediate, as the kubelet's; later ones back off, doubling to the cap; a long
// run forgets the back-off.
func TestRestartWait(t *testing.T) {
	var backoff time.Duration
	for i, tc := range []struct {
		ran, wait time.Duration
	}{
		{ran: time.Minute, wait: 0},
		{ran: time.Second, wait: 2 * time.Second},
		{ran: time.Second, wait: 4 * time.Second},
		{ran: 5 * time.Minute, wait: 8 * time.Second},
		{ran: 11 * time.Minute, wait: 0},
		{ran: time.Second, wait: 2 * time.Second},
	} {
		var wait time.Duration
		wait, backoff = restartWait(backoff, tc.ran)
		if wait != tc.wait {
			t.Errorf("exit %d after %v: wait %v, want %v", i+1, tc.ran, wait, tc.wait)
		}
	}
	backoff = 0
	for range 20 {
		_, backoff = restartWait(backoff, time.Second)
	}
	if wait, _ := restartWait(backoff, time.Second); wait != backoffMax {
		t.Errorf("after 20 quick exits: wait %v, want the cap %v", wait, backoffMax)
	}
}
