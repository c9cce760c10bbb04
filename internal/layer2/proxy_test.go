package layer2

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// xMAC is the host a deputy answers for; xMAC2 its second interface.
var (
	xMAC  = mustMAC("02:00:00:00:00:a1")
	xMAC2 = mustMAC("02:00:00:00:00:a2")
)

// checkProxyReply checks a proxy ARP reply byte by byte: Ethernet source
// ours (so switches learn nothing wrong), ARP sender the proxied host.
func checkProxyReply(t *testing.T, b []byte, ourMAC string, proxied net.HardwareAddr, vip netip.Addr) {
	t.Helper()
	f, p := parseARPWithLib(t, b)
	if p.Operation != arp.OperationReply || p.SenderIP != vip {
		t.Fatalf("want a reply for %s, got %+v", vip, p)
	}
	if f.Source.String() != ourMAC {
		t.Errorf("Ethernet source %s, want ours %s", f.Source, ourMAC)
	}
	if p.SenderHardwareAddr.String() != proxied.String() {
		t.Errorf("ARP sender hardware address %s, want the proxied host's %s", p.SenderHardwareAddr, proxied)
	}
	if f.Destination.String() != clientMAC.String() || p.TargetHardwareAddr.String() != clientMAC.String() || p.TargetIP != clientIP {
		t.Errorf("sent to %s (target %s/%s), want the requester %s/%s", f.Destination, p.TargetHardwareAddr, p.TargetIP, clientMAC, clientIP)
	}
	want := appendARP(make([]byte, minFrameLen), arpOpReply, [6]byte(clientMAC), [6]byte(mustMAC(ourMAC)), [6]byte(proxied), v4key(vip), [6]byte(clientMAC), v4key(clientIP))
	if string(b) != string(want) {
		t.Errorf("frame\n% x\nwant\n% x", b, want)
	}
}

func TestProxyARP(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ""), testLink("eth1", 3, eth1MAC, ""), testLink("eth2", 4, "02:00:00:00:00:03", ""))
	n.a.SetProxy("node-x", []netip.Addr{vip1}, map[string]net.HardwareAddr{"eth0": xMAC, "eth1": xMAC2})
	n.a.SetBalancer("ns/owned", []netip.Addr{vip2}, nil)
	e0, e1, e2 := n.arpEnd("eth0"), n.arpEnd("eth1"), n.arpEnd("eth2")

	t.Run("answered with the proxied MAC per interface", func(t *testing.T) {
		e0.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		checkProxyReply(t, e0.next(t), eth0MAC, xMAC, vip1)
		e1.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		checkProxyReply(t, e1.next(t), eth1MAC, xMAC2, vip1)
		e0.send(t, arpRequest(t, vip1, mustMAC(eth0MAC))) // unicast to us
		checkProxyReply(t, e0.next(t), eth0MAC, xMAC, vip1)
	})
	// Each ignored frame is followed by a request for the owned IP; frames
	// are handled in order, so the next frame being that reply proves the
	// ignored one produced nothing.
	t.Run("not answered on an interface the entry does not name", func(t *testing.T) {
		e2.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		e2.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		checkReply(t, e2.next(t), "02:00:00:00:00:03", vip2)
	})
	t.Run("not answered to the proxied host itself", func(t *testing.T) {
		req, err := arpFrameBytes(arp.OperationRequest, xMAC, netip.MustParseAddr("192.0.2.50"), make(net.HardwareAddr, 6), vip1, ethernet.Broadcast)
		if err != nil {
			t.Fatal(err)
		}
		e0.send(t, req)
		e0.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		checkReply(t, e0.next(t), eth0MAC, vip2)
	})
	t.Run("counted per IP", func(t *testing.T) {
		if got := testutil.ToFloat64(n.a.metrics.responses.WithLabelValues(vip1.String())); got != 3 {
			t.Errorf("responses_sent{ip=%s} = %v, want 3", vip1, got)
		}
	})
	t.Run("replacing the entry changes the MAC and the IPs", func(t *testing.T) {
		n.a.SetProxy("node-x", []netip.Addr{vipOff}, map[string]net.HardwareAddr{"eth0": xMAC2})
		e0.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		e0.send(t, arpRequest(t, vipOff, ethernet.Broadcast))
		checkProxyReply(t, e0.next(t), eth0MAC, xMAC2, vipOff)
	})
	t.Run("not answered once DeleteProxy returns", func(t *testing.T) {
		n.a.DeleteProxy("node-x")
		e0.send(t, arpRequest(t, vipOff, ethernet.Broadcast))
		e0.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		checkReply(t, e0.next(t), eth0MAC, vip2)
		n.a.DeleteProxy("node-x") // twice: no-op
	})
	t.Run("a MAC that is not 6 bytes skips its interface", func(t *testing.T) {
		n.a.SetProxy("bad", []netip.Addr{vip1}, map[string]net.HardwareAddr{"eth0": xMAC[:4], "eth1": xMAC})
		e0.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		e0.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		checkReply(t, e0.next(t), eth0MAC, vip2)
		e1.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		checkProxyReply(t, e1.next(t), eth1MAC, xMAC, vip1)
	})
}

func TestProxyOwnedWins(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ""), testLink("eth1", 3, eth1MAC, ""))
	e0, e1 := n.arpEnd("eth0"), n.arpEnd("eth1")
	macs := map[string]net.HardwareAddr{"eth0": xMAC, "eth1": xMAC}
	for _, tc := range []struct {
		name  string
		setup func()
		eth0  net.HardwareAddr // MAC answered on eth0; nil: not answered
		eth1  net.HardwareAddr
	}{
		{"proxied only", func() { n.a.SetProxy("x", []netip.Addr{vip1}, macs) }, xMAC, xMAC},
		{"owned and proxied: owned", func() { n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil) }, mustMAC(eth0MAC), mustMAC(eth1MAC)},
		{"owned on eth1 only: proxied on eth0", func() { n.a.SetBalancer("ns/a", []netip.Addr{vip1}, []string{"eth1"}) }, xMAC, mustMAC(eth1MAC)},
		{"owner gone: proxied again", func() { n.a.DeleteBalancer("ns/a") }, xMAC, xMAC},
		{"proxy gone, owned: owned", func() { n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil); n.a.DeleteProxy("x") }, mustMAC(eth0MAC), mustMAC(eth1MAC)},
		{"neither", func() { n.a.DeleteBalancer("ns/a") }, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			for _, c := range []struct {
				end      *memConn
				ifMAC    string
				expected net.HardwareAddr
			}{{e0, eth0MAC, tc.eth0}, {e1, eth1MAC, tc.eth1}} {
				c.end.send(t, arpRequest(t, vip1, ethernet.Broadcast))
				if c.expected == nil {
					n.a.SetBalancer("ns/marker", []netip.Addr{vip2}, nil)
					c.end.send(t, arpRequest(t, vip2, ethernet.Broadcast))
					checkReply(t, c.end.next(t), c.ifMAC, vip2)
					continue
				}
				f, p := parseARPWithLib(t, c.end.next(t))
				if f.Source.String() != c.ifMAC || p.SenderHardwareAddr.String() != c.expected.String() || p.SenderIP != vip1 {
					t.Errorf("on %s: Ethernet source %s, sender %s/%s; want %s, %s/%s", c.ifMAC, f.Source, p.SenderHardwareAddr, p.SenderIP, c.ifMAC, c.expected, vip1)
				}
			}
		})
	}
}

func TestProxyNoGratuitous(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1000, GratuitousInterval: time.Millisecond, ConflictGrace: -1},
		testLink("eth0", 2, eth0MAC, ll0))
	a4, a6 := n.arpEnd("eth0"), n.ndpEnd("eth0")
	drain := func() {
		for _, c := range []*memConn{a4, a6} {
			for len(c.in) > 0 {
				<-c.in
			}
		}
	}
	// firstFor returns the target of the next announcement or probe sent
	// on the ARP end.
	firstFor := func(t *testing.T) netip.Addr {
		t.Helper()
		_, p := parseARPWithLib(t, a4.next(t))
		return p.TargetIP
	}

	t.Run("proxied IPs are never announced", func(t *testing.T) {
		n.a.SetProxy("x", []netip.Addr{vip1, vip6}, map[string]net.HardwareAddr{"eth0": xMAC})
		n.a.SetBalancer("ns/marker", []netip.Addr{vip2, vip6b}, nil)
		if got := firstFor(t); got != vip2 {
			t.Fatalf("first frame is for %s, want the probe for the owned %s", got, vip2)
		}
		_, _, _, _, m := decodeNDP(t, a6.next(t))
		if na, ok := m.(*ndp.NeighborAdvertisement); !ok || na.TargetAddress != vip6b {
			t.Fatalf("first NDP frame %+v, want the unsolicited NA for the owned %s", m, vip6b)
		}
		if !n.groups["eth0"].isJoined(solicitedNodeGroup(vip6)) {
			t.Errorf("solicited-node group of proxied %s not joined: %v", vip6, n.groups["eth0"].log)
		}
		n.a.DeleteBalancer("ns/marker")
		drain()
	})
	t.Run("taking over a proxied IP announces it", func(t *testing.T) {
		n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
		if got := firstFor(t); got != vip1 {
			t.Fatalf("first frame is for %s, want the takeover probe for %s", got, vip1)
		}
	})
	t.Run("an owned IP becoming proxied stops its announcements", func(t *testing.T) {
		n.a.DeleteBalancer("ns/a") // vip1 is still proxied
		drain()                    // sends happen under the lock: none for vip1 after this
		n.a.SetBalancer("ns/marker", []netip.Addr{vip2}, nil)
		if got := firstFor(t); got != vip2 {
			t.Fatalf("after the owner left, the next frame is for %s, want %s", got, vip2)
		}
	})
	if got := testutil.ToFloat64(n.a.metrics.gratuitous.WithLabelValues(vip6.String())); got != 0 {
		t.Errorf("gratuitous_sent{ip=%s} = %v for a proxied IP", vip6, got)
	}
}

func TestProxyConflicts(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictGrace: -1, ConflictInterval: 1 << 62},
		testLink("eth0", 2, eth0MAC, ll0), testLink("eth1", 3, eth1MAC, ""))
	n.a.SetProxy("x", []netip.Addr{vip1, vip6}, map[string]net.HardwareAddr{"eth0": xMAC})
	n.a.SetBalancer("ns/marker", []netip.Addr{vip2}, nil)
	w, w6 := n.arpEnd("eth0"), n.ndpEnd("eth0")
	garp := func(mac net.HardwareAddr) []byte {
		f, err := gratuitousARP(mac, vip1)
		if err != nil {
			t.Fatal(err)
		}
		return f[1]
	}
	na := func(mac net.HardwareAddr) []byte {
		return ipv6Frame(t, mac, mustMAC("33:33:00:00:00:01"), vip6, ipv6AllNodes, &ndp.NeighborAdvertisement{
			Override: true, TargetAddress: vip6,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: mac}},
		})
	}
	// A claim that is not a conflict leaves nothing to read: the marker
	// request's reply comes next and no report is queued.
	for _, tc := range []struct {
		name  string
		frame []byte
		ndp   bool
	}{
		{"ARP from the proxied host", garp(xMAC), false},
		{"ARP from our own other interface", garp(mustMAC(eth1MAC)), false},
		{"NA from the proxied host", na(xMAC), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ndp {
				w6.send(t, tc.frame)
			} else {
				w.send(t, tc.frame)
			}
			// Both read loops have handled what came before once both
			// have answered a marker.
			w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
			checkReply(t, w.next(t), eth0MAC, vip2)
			w6.send(t, solicit(t, vip6))
			w6.next(t)
			if len(n.a.Conflicts()) != 0 {
				t.Fatalf("reported as a conflict: %+v", <-n.a.Conflicts())
			}
		})
	}
	t.Run("ARP from a third MAC: conflict, not defended", func(t *testing.T) {
		w.send(t, garp(otherMAC))
		if c := nextConflict(t, n.a); c.IP != vip1 || c.MAC.String() != otherMAC.String() || c.Interface != "eth0" || !c.Proxied {
			t.Fatalf("conflict %+v, want %s at %s on eth0", c, vip1, otherMAC)
		}
		// No defensive announcement or probe for a proxied IP: the next
		// frame sent is the marker's reply.
		w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		checkReply(t, w.next(t), eth0MAC, vip2)
	})
	t.Run("NA from a third MAC: conflict", func(t *testing.T) {
		w6.send(t, na(otherMAC))
		if c := nextConflict(t, n.a); c.IP != vip6 || c.MAC.String() != otherMAC.String() {
			t.Fatalf("conflict %+v, want %s at %s", c, vip6, otherMAC)
		}
	})
}

func TestProxyConflictGraceSendsNoProbe(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictGrace: 20 * time.Millisecond}, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetProxy("x", []netip.Addr{vip1}, map[string]net.HardwareAddr{"eth0": xMAC})
	w := n.arpEnd("eth0")
	foreign, err := arpFrameBytes(arp.OperationReply, otherMAC, vip1, clientMAC, clientIP, clientMAC)
	if err != nil {
		t.Fatal(err)
	}
	// A claim that persists past the grace is reported; for an owned IP a
	// probe re-checks after the grace, for a proxied one nothing is sent.
	deadline := time.Now().Add(10 * time.Second)
	for len(n.a.Conflicts()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("persistent claim not reported within 10s")
		}
		w.send(t, foreign)
		time.Sleep(5 * time.Millisecond)
	}
	if c := <-n.a.Conflicts(); c.IP != vip1 || c.MAC.String() != otherMAC.String() {
		t.Fatalf("conflict %+v", c)
	}
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkProxyReply(t, w.next(t), eth0MAC, xMAC, vip1)
}

func TestProxyNDP(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ll0))
	n.a.SetProxy("x", []netip.Addr{vip6}, map[string]net.HardwareAddr{"eth0": xMAC})
	w := n.ndpEnd("eth0")
	if !n.groups["eth0"].isJoined(solicitedNodeGroup(vip6)) {
		t.Fatalf("solicited-node group not joined: %v", n.groups["eth0"].log)
	}
	g := solicitedNodeGroup(vip6)
	mm := multicastMAC(g)
	for _, tc := range []struct {
		name       string
		frame      []byte
		dstMAC     net.HardwareAddr
		dst        netip.Addr
		solicited  bool
		wantAnswer bool
	}{
		{"multicast solicitation", solicit(t, vip6), clientMAC, client6, true, true},
		{"unicast NUD probe to our MAC", ipv6Frame(t, clientMAC, mustMAC(eth0MAC), client6G, vip6, &ndp.NeighborSolicitation{TargetAddress: vip6}),
			clientMAC, client6G, true, true},
		{"duplicate address detection: defended without override", ipv6Frame(t, otherMAC, net.HardwareAddr(mm[:]), netip.IPv6Unspecified(), g, &ndp.NeighborSolicitation{TargetAddress: vip6}),
			mustMAC("33:33:00:00:00:01"), ipv6AllNodes, false, true},
		{"from the proxied host: not answered", ipv6Frame(t, xMAC, net.HardwareAddr(mm[:]), netip.MustParseAddr("fe80::a1"), g, &ndp.NeighborSolicitation{
			TargetAddress: vip6, Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: xMAC}},
		}), nil, netip.Addr{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.send(t, tc.frame)
			if !tc.wantAnswer {
				w.send(t, solicit(t, vip6))
				tc.dstMAC, tc.dst, tc.solicited = clientMAC, client6, true
			}
			b := w.next(t)
			if got := net.HardwareAddr(b[6:12]).String(); got != eth0MAC {
				t.Errorf("Ethernet source %s, want ours %s", got, eth0MAC)
			}
			dstMAC, src, dst, hop, m := decodeNDP(t, b)
			a, ok := m.(*ndp.NeighborAdvertisement)
			if !ok {
				t.Fatalf("sent %T", m)
			}
			if dstMAC.String() != tc.dstMAC.String() || dst != tc.dst || src != vip6 || hop != 255 {
				t.Errorf("sent %s -> %s/%s hop %d, want %s -> %s/%s hop 255", src, dst, dstMAC, hop, vip6, tc.dst, tc.dstMAC)
			}
			if a.TargetAddress != vip6 || a.Solicited != tc.solicited || a.Override || a.Router {
				t.Errorf("advertisement %+v, want target %s solicited=%v, override and router unset", a, vip6, tc.solicited)
			}
			if len(a.Options) != 1 {
				t.Fatalf("options %v", a.Options)
			}
			if lla, ok := a.Options[0].(*ndp.LinkLayerAddress); !ok || lla.Direction != ndp.Target || lla.Addr.String() != xMAC.String() {
				t.Errorf("option %+v, want target link-layer address %s", a.Options[0], xMAC)
			}
		})
	}
	n.a.DeleteProxy("x")
	if n.groups["eth0"].isJoined(solicitedNodeGroup(vip6)) {
		t.Errorf("group still joined after DeleteProxy: %v", n.groups["eth0"].log)
	}
}

// TestHandover: an IP this node gave away is answered with its own MAC, never
// announced, until a frame from another MAC claims it (the new owner's
// gratuitous announcement), which ends the hand-over and is no conflict.
func TestHandover(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictGrace: -1, ConflictInterval: 1 << 62},
		testLink("eth0", 2, eth0MAC, ll0))
	w, w6 := n.arpEnd("eth0"), n.ndpEnd("eth0")
	n.a.SetBalancer("ns/marker", []netip.Addr{vip2}, nil)
	n.a.SetBalancer("ns/a", []netip.Addr{vip1, vip6}, nil)
	// The order owners uses: the hand-over is in place before the
	// balancer goes, so the IP is answered throughout.
	n.a.SetHandover("handover/k", []netip.Addr{vip1, vip6}, nil)
	n.a.DeleteBalancer("ns/a")
	// answered reports whether a request for vip1 is answered (with our
	// MAC); the marker's reply after it shows an unanswered one was seen.
	answered := func(t *testing.T) bool {
		t.Helper()
		w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		_, p := parseARPWithLib(t, w.next(t))
		if p.SenderIP == vip2 {
			return false
		}
		if p.SenderIP != vip1 || p.SenderHardwareAddr.String() != eth0MAC {
			t.Fatalf("answer %+v, want %s at our %s", p, vip1, eth0MAC)
		}
		w.next(t) // the marker's
		return true
	}

	t.Run("answered with our MAC", func(t *testing.T) {
		if !answered(t) {
			t.Fatal("a handed-over IP is not answered")
		}
		w6.send(t, solicit(t, vip6))
		if b := w6.next(t); net.HardwareAddr(b[6:12]).String() != eth0MAC {
			t.Fatalf("NA from %s, want ours %s", net.HardwareAddr(b[6:12]), eth0MAC)
		}
	})
	t.Run("another host's proxy wins over a hand-over", func(t *testing.T) {
		n.a.SetProxy("held/x", []netip.Addr{vip1}, map[string]net.HardwareAddr{"eth0": xMAC})
		w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
		checkProxyReply(t, w.next(t), eth0MAC, xMAC, vip1)
		n.a.DeleteProxy("held/x")
		if !answered(t) {
			t.Fatal("the hand-over ended with the other entry")
		}
	})
	t.Run("the new owner's announcement ends it, no conflict", func(t *testing.T) {
		f, err := gratuitousARP(otherMAC, vip1)
		if err != nil {
			t.Fatal(err)
		}
		w.send(t, f[1])
		deadline := time.Now().Add(10 * time.Second)
		for answered(t) {
			if time.Now().After(deadline) {
				t.Fatal("still answered 10 s after another MAC announced it")
			}
		}
		w6.send(t, ipv6Frame(t, otherMAC, mustMAC("33:33:00:00:00:01"), vip6, ipv6AllNodes, &ndp.NeighborAdvertisement{
			Override: true, TargetAddress: vip6,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: otherMAC}},
		}))
		for n.groups["eth0"].isJoined(solicitedNodeGroup(vip6)) {
			if time.Now().After(deadline) {
				t.Fatal("IPv6 hand-over not ended 10 s after another MAC advertised it")
			}
			time.Sleep(time.Millisecond)
		}
		if len(n.a.Conflicts()) != 0 {
			t.Fatalf("reported as a conflict: %+v", <-n.a.Conflicts())
		}
		if got := testutil.ToFloat64(n.a.metrics.conflicts.WithLabelValues(vip1.String())); got != 0 {
			t.Errorf("conflicts{ip=%s} = %v", vip1, got)
		}
	})
	t.Run("only on the interfaces it was announced on", func(t *testing.T) {
		n.a.SetHandover("handover/k", []netip.Addr{vip1}, []string{"eth1"})
		if answered(t) {
			t.Fatal("answered on eth0, not among the hand-over's interfaces")
		}
		n.a.SetHandover("handover/k", []netip.Addr{vip1}, []string{"eth0"})
		if !answered(t) {
			t.Fatal("not answered on eth0, the hand-over's interface")
		}
	})
	t.Run("DeleteProxy ends it", func(t *testing.T) {
		n.a.SetHandover("handover/k", []netip.Addr{vip1}, nil)
		if !answered(t) {
			t.Fatal("not answered after SetHandover")
		}
		n.a.DeleteProxy("handover/k")
		if answered(t) {
			t.Fatal("answered after DeleteProxy")
		}
	})
	t.Run("not handed over once another host announced it", func(t *testing.T) {
		// The new owner decided the move first and announced: this node,
		// still the owner, saw its claim, then gives the IP away.
		n.a.SetBalancer("ns/c", []netip.Addr{vipOff}, nil)
		f, err := gratuitousARP(otherMAC, vipOff)
		if err != nil {
			t.Fatal(err)
		}
		w.send(t, f[1])
		if c := nextConflict(t, n.a); c.IP != vipOff {
			t.Fatalf("conflict %+v, want %s", c, vipOff)
		}
		n.a.SetHandover("handover/c", []netip.Addr{vipOff}, nil)
		n.a.DeleteBalancer("ns/c")
		w.send(t, arpRequest(t, vipOff, ethernet.Broadcast))
		w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
		// The first reply to the client (the conflict's defensive
		// announcements may come before it) must be the marker's.
		for {
			_, p := parseARPWithLib(t, w.next(t))
			if p.Operation != arp.OperationReply || p.TargetHardwareAddr.String() != clientMAC.String() {
				continue
			}
			if p.SenderIP != vip2 {
				t.Fatalf("answered %+v: an IP the new owner already announced was handed over", p)
			}
			break
		}
	})
	if got := testutil.ToFloat64(n.a.metrics.gratuitous.WithLabelValues(vip1.String())); got != 0 {
		t.Errorf("gratuitous_sent{ip=%s} = %v for a handed-over IP", vip1, got)
	}
}
