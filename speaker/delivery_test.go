package speaker

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/ironlb/ironlb/internal/ownership"
)

func TestVoteOf(t *testing.T) {
	const (
		up, down, unknown, unhealthy = ownership.PathUp, ownership.PathDown, ownership.PathUnknown, ownership.PathUnhealthy
	)
	for _, tc := range []struct {
		kernel ownership.Path
		d      delivery
		want   ownership.Path
	}{
		{down, deliveryHealthy, down},         // a silent kernel is down whatever the endpoint said
		{down, deliveryFailing, down},         //
		{up, deliveryFailing, unhealthy},      // alive, not delivering
		{unknown, deliveryFailing, unhealthy}, // no on-link interface: the endpoint still refused
		{up, deliveryHealthy, up},             //
		{unknown, deliveryHealthy, up},        // no on-link interface: its TCP stack and kube-proxy answered
		{up, deliveryPending, unknown},        // not vouched for before healthyAfter
		{up, deliveryUnchecked, up},           // checks off: the kernel alone, as before
		{unknown, deliveryUnchecked, unknown}, //
	} {
		if got := voteOf(tc.kernel, tc.d); got != tc.want {
			t.Errorf("voteOf(kernel %s, delivery %s) = %s, want %s", tc.kernel, tc.d, got, tc.want)
		}
	}
}

// TestDeliveryHysteresis: failing after failAfter definite failures in a
// row, healthy after passing for healthyAfter, no answer changes nothing.
func TestDeliveryHysteresis(t *testing.T) {
	const after = 5 * time.Second
	t0 := time.Unix(1000, 0)
	type step struct {
		at   time.Duration
		r    checkResult
		want delivery
	}
	for name, steps := range map[string][]step{
		"joins: pending until healthy for healthyAfter": {
			{0, checkPassed, deliveryPending}, {4 * time.Second, checkPassed, deliveryPending}, {5 * time.Second, checkPassed, deliveryHealthy},
		},
		"one failure is not failing": {
			{0, checkPassed, deliveryPending}, {5 * time.Second, checkPassed, deliveryHealthy},
			{5200 * time.Millisecond, checkFailed, deliveryHealthy}, {5400 * time.Millisecond, checkPassed, deliveryHealthy},
		},
		"two in a row are, and recovery takes healthyAfter again": {
			{0, checkPassed, deliveryPending}, {5 * time.Second, checkPassed, deliveryHealthy},
			{6 * time.Second, checkFailed, deliveryHealthy}, {6200 * time.Millisecond, checkFailed, deliveryFailing},
			{7 * time.Second, checkPassed, deliveryPending}, {11 * time.Second, checkPassed, deliveryPending},
			{12 * time.Second, checkPassed, deliveryHealthy},
		},
		"no answer changes nothing and does not break a run": {
			{0, checkFailed, deliveryPending}, {200 * time.Millisecond, checkNoAnswer, deliveryPending},
			{400 * time.Millisecond, checkFailed, deliveryFailing}, {600 * time.Millisecond, checkNoAnswer, deliveryFailing},
			{time.Second, checkPassed, deliveryPending}, {3 * time.Second, checkNoAnswer, deliveryPending}, {6 * time.Second, checkPassed, deliveryHealthy},
		},
		"a failure restarts the passing run": {
			{0, checkPassed, deliveryPending}, {4 * time.Second, checkFailed, deliveryPending},
			{5 * time.Second, checkPassed, deliveryPending}, {9 * time.Second, checkPassed, deliveryPending}, {10 * time.Second, checkPassed, deliveryHealthy},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var s deliveryState
			for i, st := range steps {
				s.observe(st.r, t0.Add(st.at), after)
				if s.state != st.want {
					t.Fatalf("step %d (%v at %v): %s, want %s", i, st.r, st.at, s.state, st.want)
				}
			}
		})
	}
}

// TestHealthCheck asks a real HTTP server as kube-proxy's endpoint: 200
// passes, 503 fails, a closed port (the kernel's reset) fails, a port that
// never answers is no answer.
func TestHealthCheck(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	ap := netip.MustParseAddrPort(srv.Listener.Addr().String())
	c := newHealthChecker(int(ap.Port()), 0)
	ctx := context.Background()
	if r, why := c.check(ctx, ap.Addr()); r != checkPassed {
		t.Errorf("200: %v (%s)", r, why)
	}
	status = http.StatusServiceUnavailable
	if r, why := c.check(ctx, ap.Addr()); r != checkFailed {
		t.Errorf("503: %v (%s)", r, why)
	}
	// A port nobody listens on: the kernel refuses it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	if r, why := newHealthChecker(int(closed.Port()), 0).check(ctx, closed.Addr()); r != checkFailed {
		t.Errorf("refused port %s: %v (%s)", closed, r, why)
	}
	// A listener that never accepts past the backlog answers nothing in
	// time: the request times out (bounded by the context here).
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	port := int(netip.MustParseAddrPort(hang.Addr().String()).Port())
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if r, why := newHealthChecker(port, 0).check(tctx, netip.MustParseAddr("127.0.0.1")); r != checkNoAnswer {
		t.Errorf("a server that never answers: %v (%s)", r, why)
	}
}

// TestHealthCheckUncheckedUntilAnswered: while the endpoint has answered on
// no node (a kube-proxy replacement without it: every port refused), the
// findings are unchecked, so the kernel alone judges; once one node
// answered, a refused port counts.
func TestHealthCheckUncheckedUntilAnswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	c := newHealthChecker(int(closed.Port()), time.Millisecond)
	w := newDeliveryWatch()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, c, closed.Addr()) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		st := w.st.state
		w.mu.Unlock()
		if st == deliveryFailing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a refused port never made the finding failing: %s", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d, _, why := w.get(c); d != deliveryUnchecked {
		t.Fatalf("refused everywhere, never answered: %s (%s), want unchecked", d, why)
	}
	c.answered.Store(true) // another node's endpoint answered
	if d, _, _ := w.get(c); d != deliveryFailing {
		t.Fatalf("refused here, answered elsewhere: %s, want failing", d)
	}
}
