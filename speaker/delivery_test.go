package speaker

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ironlb/ironlb/internal/layer2"
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
		"two findings agreeing fail at once": {
			{0, checkPassed, deliveryPending}, {5 * time.Second, checkPassed, deliveryHealthy},
			{6 * time.Second, checkFailedSure, deliveryFailing},
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
	_ = ln.Close()
	if r, why := newHealthChecker(int(closed.Port()), 0).check(ctx, closed.Addr()); r != checkFailed {
		t.Errorf("refused port %s: %v (%s)", closed, r, why)
	}
	// A listener that never accepts past the backlog answers nothing in
	// time: the request times out (bounded by the context here).
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hang.Close() }()
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
	_ = ln.Close()
	c := newHealthChecker(int(closed.Port()), time.Millisecond)
	w := newDeliveryWatch("w1", nil)
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

func TestCombineChecks(t *testing.T) {
	for _, tc := range []struct {
		r     checkResult
		v     serviceVerdict
		fails int
		want  checkResult
		wantF int
	}{
		{checkFailed, serviceDelivered, 0, checkPassed, 0},                                    // kube-proxy restarting, rules in place: delivers
		{checkPassed, serviceDelivered, 2, checkPassed, 0},                                    // a delivered round ends a run of failures
		{checkFailed, serviceBlackholed, 0, checkFailedSure, 1},                               // kube-proxy down and its Services go nowhere: at once
		{checkPassed, serviceBlackholed, 0, checkNoAnswer, 1},                                 // one round is not a verdict
		{checkPassed, serviceBlackholed, serviceFailAfter - 1, checkFailed, serviceFailAfter}, // serviceFailAfter rounds: pod network cut
		{checkFailed, serviceUnknown, 0, checkFailed, 0},                                      // the Service is broken everywhere: kube-proxy decides
		{checkPassed, serviceUnknown, 1, checkPassed, 1},                                      //
		{checkNoAnswer, serviceUntried, 0, checkNoAnswer, 0},                                  //
		{checkNoAnswer, serviceDelivered, 0, checkPassed, 0},                                  // a lost health request, a delivered connection
		{checkNoAnswer, serviceBlackholed, serviceFailAfter - 1, checkFailed, serviceFailAfter},
	} {
		got, gotF := combineChecks(tc.r, tc.v, tc.fails)
		if got != tc.want || gotF != tc.wantF {
			t.Errorf("combineChecks(%v, %v, %d) = %v, %d; want %v, %d", tc.r, tc.v, tc.fails, got, gotF, tc.want, tc.wantF)
		}
	}
}

// fakeSYN answers SYN probes by the MAC they are sent to.
type fakeSYN struct{ byMAC map[string]layer2.SYNOutcome }

func (f fakeSYN) Probe(_ context.Context, pr layer2.SYNProbe) layer2.SYNProbeResult {
	return layer2.SYNProbeResult{Outcome: f.byMAC[pr.OwnerMAC.String()]}
}

func TestServiceRound(t *testing.T) {
	owner, other := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	target := netip.MustParseAddrPort("172.18.255.200:80")
	check := func(syn fakeSYN, hasTarget, hasControl bool) serviceVerdict {
		sc := &serviceCheck{syn: syn,
			target:  func(string) (netip.AddrPort, bool) { return target, hasTarget },
			control: func(string, string) (net.HardwareAddr, bool) { return other, hasControl }}
		v, _ := sc.round(context.Background(), "w1", "eth0", owner)
		return v
	}
	answered := layer2.SYNAnswered
	for name, tc := range map[string]struct {
		syn                   fakeSYN
		hasTarget, hasControl bool
		want                  serviceVerdict
	}{
		"answered":            {fakeSYN{map[string]layer2.SYNOutcome{owner.String(): answered}}, true, true, serviceDelivered},
		"reset by a backend":  {fakeSYN{map[string]layer2.SYNOutcome{owner.String(): layer2.SYNRefused}}, true, true, serviceDelivered},
		"only the control":    {fakeSYN{map[string]layer2.SYNOutcome{owner.String(): layer2.SYNTimeout, other.String(): answered}}, true, true, serviceBlackholed},
		"neither":             {fakeSYN{map[string]layer2.SYNOutcome{owner.String(): layer2.SYNTimeout, other.String(): layer2.SYNTimeout}}, true, true, serviceUnknown},
		"no control":          {fakeSYN{map[string]layer2.SYNOutcome{owner.String(): layer2.SYNTimeout}}, true, false, serviceUnknown},
		"owns no TCP Service": {fakeSYN{}, false, true, serviceUntried},
	} {
		if got := check(tc.syn, tc.hasTarget, tc.hasControl); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

// flakySYN loses the first SYN sent to each MAC and answers the others.
type flakySYN struct {
	mu   sync.Mutex
	sent map[string]int
}

func (f *flakySYN) Probe(_ context.Context, pr layer2.SYNProbe) layer2.SYNProbeResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent[pr.OwnerMAC.String()]++
	if f.sent[pr.OwnerMAC.String()] == 1 {
		return layer2.SYNProbeResult{Outcome: layer2.SYNTimeout}
	}
	return layer2.SYNProbeResult{Outcome: layer2.SYNAnswered}
}

// TestServiceTryConfirms: an unanswered SYN is not a verdict: confirmTries
// more go out at once, and one answer makes the owner deliver.
func TestServiceTryConfirms(t *testing.T) {
	owner := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	syn := &flakySYN{sent: map[string]int{}}
	sc := &serviceCheck{syn: syn,
		target:  func(string) (netip.AddrPort, bool) { return netip.MustParseAddrPort("172.18.255.200:80"), true },
		control: func(string, string) (net.HardwareAddr, bool) { return nil, false }}
	if v, why := sc.round(context.Background(), "w1", "eth0", owner); v != serviceDelivered {
		t.Fatalf("first SYN lost, the confirmations answered: %v (%s), want delivered", v, why)
	}
	if n := syn.sent[owner.String()]; n != 1+confirmTries {
		t.Errorf("%d SYNs sent, want 1 + %d confirmations", n, confirmTries)
	}
}
