package layer2

import (
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestHold: while held, requests for an owned IP are seen but not answered
// and its takeover announcement waits; once the hold ends, the announcement
// goes out and requests are answered again.
func TestHold(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1, GratuitousInterval: time.Hour, ConflictGrace: -1},
		testLink("eth0", 2, eth0MAC, ll0))
	w, w6 := n.arpEnd("eth0"), n.ndpEnd("eth0")
	n.a.Hold(time.Now().Add(time.Hour))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1, vip6}, nil)

	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	w6.send(t, solicit(t, vip6))
	waitFor(t, "both requests seen", func() bool {
		return testutil.ToFloat64(n.a.metrics.requests.WithLabelValues(vip1.String())) == 1 &&
			testutil.ToFloat64(n.a.metrics.requests.WithLabelValues(vip6.String())) == 1
	})
	if len(w.in) != 0 || len(w6.in) != 0 {
		t.Fatalf("sent %d ARP and %d NDP frames while held, want none", len(w.in), len(w6.in))
	}

	n.a.Hold(time.Time{})
	// The pending announcement goes first; then a fresh request is answered.
	// A reply to the held request would come before the fresh one's: the
	// read loop answers in order.
	_, p := parseARPWithLib(t, w.next(t))
	if p.Operation != arp.OperationRequest || p.SenderIP != vip1 || p.TargetIP != vip1 {
		t.Fatalf("first frame after the hold %+v, want the gratuitous request for %s", p, vip1)
	}
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	replies := 0
	for replies == 0 || len(w.in) > 0 {
		_, p := parseARPWithLib(t, w.next(t))
		if p.Operation == arp.OperationReply && p.TargetIP == clientIP {
			replies++
		}
	}
	if replies != 1 {
		t.Fatalf("%d replies to the client after the hold, want 1 (the held request must not be answered late)", replies)
	}
	if b := w6.next(t); b == nil {
		t.Fatal("no unsolicited NA after the hold")
	}

	t.Run("a hold ends by itself", func(t *testing.T) {
		n.a.Hold(time.Now().Add(100 * time.Millisecond))
		before := testutil.ToFloat64(n.a.metrics.responses.WithLabelValues(vip1.String()))
		waitFor(t, "a request answered after the hold's end", func() bool {
			w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
			time.Sleep(10 * time.Millisecond)
			for len(w.in) > 0 {
				<-w.in
			}
			return testutil.ToFloat64(n.a.metrics.responses.WithLabelValues(vip1.String())) > before
		})
	})
}
