package layer2

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var (
	eth0MAC = "02:00:00:00:00:01"
	eth1MAC = "02:00:00:00:00:02"
	vip1    = netip.MustParseAddr("192.0.2.10")
	vip2    = netip.MustParseAddr("192.0.2.11")
	vipOff  = netip.MustParseAddr("192.0.2.99")
)

// quiet disables gratuitous bursts so that every frame the responder sends
// is a reply, and the conflict grace so that conflicts are reported at once.
var quiet = Options{GratuitousCount: -1, ConflictGrace: -1}

func checkReply(t *testing.T, b []byte, ifMAC string, vip netip.Addr) {
	t.Helper()
	f, p := parseARPWithLib(t, b)
	if p.Operation != arp.OperationReply {
		t.Fatalf("operation %v, want reply", p.Operation)
	}
	if f.Destination.String() != clientMAC.String() {
		t.Errorf("Ethernet destination %s, want the requester %s (unicast)", f.Destination, clientMAC)
	}
	if f.Source.String() != ifMAC || p.SenderHardwareAddr.String() != ifMAC {
		t.Errorf("source MAC %s / sender %s, want the interface MAC %s", f.Source, p.SenderHardwareAddr, ifMAC)
	}
	if p.SenderIP != vip {
		t.Errorf("sender IP %s, want %s", p.SenderIP, vip)
	}
	if p.TargetIP != clientIP || p.TargetHardwareAddr.String() != clientMAC.String() {
		t.Errorf("target %s/%s, want the requester %s/%s", p.TargetIP, p.TargetHardwareAddr, clientIP, clientMAC)
	}
}

func TestARPAnswersOnlyOwnedIPs(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")

	// Each ignored frame is followed by a request for the owned IP: frames
	// are handled in order, so the next frame sent being that reply proves
	// the ignored one produced nothing.
	ignored := map[string][]byte{
		"request for an IP we do not own": arpRequest(t, vipOff, ethernet.Broadcast),
		"request unicast to another MAC":  arpRequest(t, vip1, otherMAC),
	}
	reply, err := arpFrameBytes(arp.OperationReply, otherMAC, vipOff, clientMAC, clientIP, clientMAC)
	if err != nil {
		t.Fatal(err)
	}
	ignored["a reply"] = reply
	garp, err := gratuitousARP(clientMAC, clientIP)
	if err != nil {
		t.Fatal(err)
	}
	ignored["a gratuitous request"] = garp[0]
	ignored["a truncated request"] = arpRequest(t, vip1, ethernet.Broadcast)[:41]
	for name, f := range ignored {
		t.Run(name, func(t *testing.T) {
			w.send(t, f)
			w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
			checkReply(t, w.next(t), eth0MAC, vip1)
		})
	}
	t.Run("request unicast to our MAC", func(t *testing.T) {
		w.send(t, arpRequest(t, vip1, mustMAC(eth0MAC)))
		checkReply(t, w.next(t), eth0MAC, vip1)
	})
	if got := testutil.ToFloat64(n.a.metrics.requests.WithLabelValues(vip1.String())); got != 6 {
		t.Errorf("metallb_layer2_requests_received{ip=%s} = %v, want 6", vip1, got)
	}
	if got := testutil.ToFloat64(n.a.metrics.responses.WithLabelValues(vip1.String())); got != 6 {
		t.Errorf("metallb_layer2_responses_sent{ip=%s} = %v, want 6", vip1, got)
	}
}

func TestARPInterfaceRestriction(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ""), testLink("eth1", 3, eth1MAC, ""))
	n.a.SetBalancer("ns/only-eth1", []netip.Addr{vip1}, []string{"eth1"})
	n.a.SetBalancer("ns/all", []netip.Addr{vip2}, nil)
	e0, e1 := n.arpEnd("eth0"), n.arpEnd("eth1")

	e0.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	e0.send(t, arpRequest(t, vip2, ethernet.Broadcast))
	checkReply(t, e0.next(t), eth0MAC, vip2) // vip1 not answered on eth0

	e1.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, e1.next(t), eth1MAC, vip1)
	e1.send(t, arpRequest(t, vip2, ethernet.Broadcast))
	checkReply(t, e1.next(t), eth1MAC, vip2)
}

func TestARPStopsAtOnceAfterDelete(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	n.a.SetBalancer("ns/b", []netip.Addr{vip2}, nil)
	w := n.arpEnd("eth0")
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)

	n.a.DeleteBalancer("ns/a")
	// The owned set is swapped before DeleteBalancer returns: the very next
	// request for vip1 is not answered.
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip2)

	// Shared IPs are refcounted: removing one of two balancers keeps it.
	n.a.SetBalancer("ns/c", []netip.Addr{vip2}, nil)
	n.a.DeleteBalancer("ns/b")
	w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip2)

	// Changing a balancer's IPs drops the old one at once.
	n.a.SetBalancer("ns/c", []netip.Addr{vip1}, nil)
	w.send(t, arpRequest(t, vip2, ethernet.Broadcast))
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)
}

func TestGratuitousARPOnTakeover(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 3, GratuitousInterval: 5_000_000}, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")

	for burst := range 3 {
		for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
			f, p := parseARPWithLib(t, w.next(t))
			if p.Operation != op || p.SenderIP != vip1 || p.TargetIP != vip1 ||
				p.SenderHardwareAddr.String() != eth0MAC || f.Source.String() != eth0MAC ||
				!slices.Equal(f.Destination, ethernet.Broadcast) || !slices.Equal(p.TargetHardwareAddr, ethernet.Broadcast) {
				t.Fatalf("burst %d: want gratuitous %v for %s from %s to broadcast, got eth dst %s, %+v", burst, op, vip1, eth0MAC, f.Destination, p)
			}
		}
		if burst == 0 {
			// The RFC 5227 probe ends the first burst.
			checkProbe(t, w.next(t), vip1)
		}
	}
	waitFor(t, "gratuitous counter", func() bool {
		return testutil.ToFloat64(n.a.metrics.gratuitous.WithLabelValues(vip1.String())) == 6
	})
	// No more: after the bursts, the next frame is the reply to a request.
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)

	// A re-set of the same balancer is not a takeover: no new burst.
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)
}

func checkProbe(t *testing.T, b []byte, ip netip.Addr) {
	t.Helper()
	f, p := parseARPWithLib(t, b)
	if p.Operation != arp.OperationRequest || p.SenderIP != netip.IPv4Unspecified() || p.TargetIP != ip ||
		!slices.Equal(f.Destination, ethernet.Broadcast) || p.SenderHardwareAddr.String() != eth0MAC {
		t.Fatalf("want an RFC 5227 probe for %s, got eth dst %s, %+v", ip, f.Destination, p)
	}
}

// TestTakeoverAnnouncesEveryIPFirst: a takeover of many IPs sends every IP's
// gratuitous request before any IP's reply, and the probes last, so the last
// IP's announcement waits behind one frame per IP, not three.
func TestTakeoverAnnouncesEveryIPFirst(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1, GratuitousInterval: time.Hour, ConflictGrace: -1}, testLink("eth0", 2, eth0MAC, ""))
	var ips []netip.Addr
	for i := range 20 {
		ips = append(ips, netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)}))
	}
	n.a.SetBalancer("ns/a", ips, nil) // one call: one burst for all of them
	w := n.arpEnd("eth0")
	for _, rank := range []string{"request", "reply", "probe"} {
		seen := map[netip.Addr]bool{}
		for range ips {
			_, p := parseARPWithLib(t, w.next(t))
			ip := p.TargetIP
			switch rank {
			case "request":
				if p.Operation != arp.OperationRequest || p.SenderIP != ip {
					t.Fatalf("want every IP's gratuitous request first, got %+v", p)
				}
			case "reply":
				if p.Operation != arp.OperationReply || p.SenderIP != ip {
					t.Fatalf("want every IP's gratuitous reply second, got %+v", p)
				}
			case "probe":
				if p.Operation != arp.OperationRequest || p.SenderIP != netip.IPv4Unspecified() {
					t.Fatalf("want every IP's probe last, got %+v", p)
				}
			}
			if !slices.Contains(ips, ip) || seen[ip] {
				t.Fatalf("%s: frame for %s, want one for each of %v", rank, ip, ips)
			}
			seen[ip] = true
		}
	}
}

func TestGratuitousStopsOnLoss(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1000, GratuitousInterval: 1_000_000}, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")
	w.next(t) // the burst has started
	n.a.DeleteBalancer("ns/a")
	// Sends happen under the announcer lock, so nothing for vip1 is sent
	// after DeleteBalancer returned; drain what was sent before.
	for len(w.in) > 0 {
		<-w.in
	}
	n.a.SetBalancer("ns/b", []netip.Addr{vip2}, nil)
	_, p := parseARPWithLib(t, w.next(t))
	if p.TargetIP != vip2 {
		t.Fatalf("after DeleteBalancer the next frame is for %s, want the announcement of %s", p.TargetIP, vip2)
	}
}

func TestConflictDetection(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictInterval: 1 << 62, ConflictGrace: -1},
		testLink("eth0", 2, eth0MAC, ""), testLink("eth1", 3, eth1MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")

	// Our own other interface announcing the same IP is not a conflict.
	own, err := gratuitousARP(mustMAC(eth1MAC), vip1)
	if err != nil {
		t.Fatal(err)
	}
	w.send(t, own[1])
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)
	if len(n.a.Conflicts()) != 0 {
		t.Fatalf("own MAC reported as a conflict: %+v", <-n.a.Conflicts())
	}

	foreign, err := arpFrameBytes(arp.OperationReply, otherMAC, vip1, clientMAC, clientIP, clientMAC)
	if err != nil {
		t.Fatal(err)
	}
	w.send(t, foreign)
	c := nextConflict(t, n.a)
	if c.IP != vip1 || c.MAC.String() != otherMAC.String() || c.Interface != "eth0" || c.Time.IsZero() || c.Proxied {
		t.Fatalf("conflict %+v, want %s at %s on eth0", c, vip1, otherMAC)
	}
	// One defensive announcement, no more (bounded, no fight).
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		_, p := parseARPWithLib(t, w.next(t))
		if p.Operation != op || p.SenderIP != vip1 || p.TargetIP != vip1 {
			t.Fatalf("want defensive gratuitous %v for %s, got %+v", op, vip1, p)
		}
	}
	// The other host keeps going (reply and a gratuitous request): rate
	// limited, no new report, no new announcement.
	othersGARP, err := gratuitousARP(otherMAC, vip1)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		w.send(t, foreign)
		w.send(t, othersGARP[0])
	}
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)
	if len(n.a.Conflicts()) != 0 {
		t.Errorf("conflict reported again within the interval")
	}
	if got := testutil.ToFloat64(n.a.metrics.conflicts.WithLabelValues(vip1.String())); got != 1 {
		t.Errorf("ironlb_layer2_conflicts_total = %v, want 1", got)
	}
}

func TestProbeAnswered(t *testing.T) {
	// Another host probing (RFC 5227, sender IP 0.0.0.0) for an IP we own is
	// answered: that is how it learns the address is taken.
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")
	probe, err := arpProbe(clientMAC, vip1)
	if err != nil {
		t.Fatal(err)
	}
	w.send(t, probe)
	f, p := parseARPWithLib(t, w.next(t))
	if p.Operation != arp.OperationReply || p.SenderIP != vip1 || p.TargetIP != netip.IPv4Unspecified() ||
		f.Destination.String() != clientMAC.String() {
		t.Fatalf("probe answer: eth dst %s, %+v", f.Destination, p)
	}
	if len(n.a.Conflicts()) != 0 {
		t.Fatalf("a probe is not a conflict for us")
	}
}

func TestInterfaceChanges(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1, GratuitousInterval: 1_000_000}, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	n.arpEnd("eth0").next(t) // the announcement

	// A new interface appears: it gets a responder and an announcement.
	n.mu.Lock()
	n.links = append(n.links, testLink("eth1", 3, eth1MAC, ""), testLink("veth123", 4, "02:00:00:00:00:03", ""))
	n.mu.Unlock()
	n.a.kickRescan()
	waitFor(t, "responder on eth1", func() bool { return slices.Equal(n.a.Interfaces(), []string{"eth0", "eth1"}) })
	_, p := parseARPWithLib(t, n.arpEnd("eth1").next(t))
	if p.TargetIP != vip1 {
		t.Fatalf("new interface: want the announcement of %s, got %+v", vip1, p)
	}

	// eth0 goes down: its responder is closed.
	old := n.arpEnd("eth0")
	n.mu.Lock()
	n.links[0].Up = false
	n.mu.Unlock()
	n.a.kickRescan()
	waitFor(t, "eth0 responder closed", func() bool { return slices.Equal(n.a.Interfaces(), []string{"eth1"}) })
	select {
	case <-old.peer.closed:
	default:
		t.Fatalf("eth0 socket not closed")
	}
}

func TestARPReplyMatchesLibrary(t *testing.T) {
	mac := [6]byte(mustMAC(eth0MAC))
	got := appendARPReply(make([]byte, minFrameLen), mac, mac, v4key(vip1), [6]byte(clientMAC), v4key(clientIP))
	want, err := arpFrameBytes(arp.OperationReply, net.HardwareAddr(mac[:]), vip1, clientMAC, clientIP, clientMAC)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("hand-built reply\n% x\ndiffers from mdlayher/arp's\n% x", got, want)
	}
}

func TestPeriodicRefresh(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1, GratuitousInterval: 1_000_000, RefreshInterval: 2_000_000},
		testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")
	// The takeover burst, then refresh bursts for as long as the IP is owned.
	for i := range 4 {
		for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
			_, p := parseARPWithLib(t, w.next(t))
			if p.Operation != op || p.SenderIP != vip1 || p.TargetIP != vip1 {
				t.Fatalf("burst %d: want gratuitous %v for %s, got %+v", i, op, vip1, p)
			}
		}
		if i == 0 {
			checkProbe(t, w.next(t), vip1)
		}
	}
	n.a.DeleteBalancer("ns/a")
	for len(w.in) > 0 {
		<-w.in
	}
	n.a.SetBalancer("ns/b", []netip.Addr{vip2}, nil)
	if _, p := parseARPWithLib(t, w.next(t)); p.TargetIP != vip2 {
		t.Fatalf("refresh for %s continued after DeleteBalancer: %+v", vip1, p)
	}
}

func TestMetricNames(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1, GratuitousInterval: 1_000_000}, testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")
	w.next(t) // gratuitous request
	w.next(t) // gratuitous reply
	w.next(t) // probe
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	w.next(t)
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetType().String()
	}
	for _, name := range []string{"metallb_layer2_requests_received", "metallb_layer2_responses_sent", "metallb_layer2_gratuitous_sent", "ironlb_layer2_conflicts_total"} {
		if got[name] != "COUNTER" {
			t.Errorf("metric %s: type %q, want a counter (registered: %v)", name, got[name], got)
		}
	}
	// Request and reply; the probe is not counted.
	waitFor(t, "gratuitous_sent = 2", func() bool {
		return testutil.ToFloat64(n.a.metrics.gratuitous.WithLabelValues(vip1.String())) == 2
	})
}

// nextConflict waits (with a generous deadline) for a conflict report.
func nextConflict(t *testing.T, a *Announcer) Conflict {
	t.Helper()
	select {
	case c := <-a.Conflicts():
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("no conflict reported within 10s")
		return Conflict{}
	}
}

func TestConflictGraceRecheck(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictGrace: 50 * time.Millisecond},
		testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")
	foreign, err := arpFrameBytes(arp.OperationReply, otherMAC, vip1, clientMAC, clientIP, clientMAC)
	if err != nil {
		t.Fatal(err)
	}
	// The previous owner still answers right after the takeover: not
	// reported yet; one probe re-checks once the grace has passed.
	w.send(t, foreign)
	f, p := parseARPWithLib(t, w.next(t))
	if p.Operation != arp.OperationRequest || p.SenderIP != netip.IPv4Unspecified() || p.TargetIP != vip1 || !slices.Equal(f.Destination, ethernet.Broadcast) {
		t.Fatalf("want a re-check probe for %s, got eth dst %s %+v", vip1, f.Destination, p)
	}
	if len(n.a.Conflicts()) != 0 {
		t.Fatalf("conflict reported within the grace period")
	}
	// The other host is still there and answers the probe: reported.
	w.send(t, foreign)
	if c := defendUntilReported(t, n.a, w, foreign); c.IP != vip1 || c.MAC.String() != otherMAC.String() {
		t.Fatalf("conflict %+v", c)
	}
}

// defendUntilReported waits for a conflict report while the other host
// answers every re-check probe with claim. A claim is reported when seen
// between one and two grace periods after the first sighting; on a loaded
// machine the test's answer can miss that window, and the announcer then
// starts over with a new probe, which the other host answers again, as a
// real one would.
func defendUntilReported(t *testing.T, a *Announcer, w *memConn, claim []byte) Conflict {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-a.Conflicts():
			return c
		case <-w.in: // another re-check probe
			w.send(t, claim)
		case <-deadline:
			t.Fatalf("no conflict reported within 10s")
		}
	}
}

func TestConflictGraceHandoverSilent(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictGrace: 20 * time.Millisecond},
		testLink("eth0", 2, eth0MAC, ""))
	n.a.SetBalancer("ns/a", []netip.Addr{vip1}, nil)
	w := n.arpEnd("eth0")
	// The previous owner's last gratuitous ARP, then it lets go.
	garp, err := gratuitousARP(otherMAC, vip1)
	if err != nil {
		t.Fatal(err)
	}
	w.send(t, garp[0])
	if _, p := parseARPWithLib(t, w.next(t)); p.SenderIP != netip.IPv4Unspecified() || p.TargetIP != vip1 {
		t.Fatalf("want a re-check probe, got %+v", p)
	}
	// Nobody answers the probe; a request is answered as usual, and no
	// conflict was ever reported.
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vip1)
	if len(n.a.Conflicts()) != 0 {
		t.Fatalf("handover reported as a conflict: %+v", <-n.a.Conflicts())
	}
}

// TestApplyBatch: several balancer changes applied as one behave as the same
// changes one by one: new IPs answered and announced, removed ones silent at
// once, shared IPs kept while one balancer still owns them.
func TestApplyBatch(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 1, GratuitousInterval: time.Hour, ConflictGrace: -1}, testLink("eth0", 2, eth0MAC, ""))
	w := n.arpEnd("eth0")
	n.a.Apply([]BalancerUpdate{
		{Name: "ns/a", IPs: []netip.Addr{vip1}},
		{Name: "ns/b", IPs: []netip.Addr{vip2}},
		{Name: "ns/c", IPs: []netip.Addr{vip2}}, // shares vip2
		{Name: "ns/never", Delete: true},        // unknown: nothing to do
	})
	// Both new IPs are announced (probe, then a request and a reply each).
	announced := map[netip.Addr]int{}
	for range 6 {
		_, p := parseARPWithLib(t, w.next(t))
		if p.SenderIP == p.TargetIP {
			announced[p.SenderIP]++
		}
	}
	if announced[vip1] != 2 || announced[vip2] != 2 {
		t.Fatalf("gratuitous frames per IP %v, want 2 for %s and %s", announced, vip1, vip2)
	}
	for _, ip := range []netip.Addr{vip1, vip2} {
		w.send(t, arpRequest(t, ip, ethernet.Broadcast))
		checkReply(t, w.next(t), eth0MAC, ip)
	}

	// One batch: a is deleted, b moves to vipOff, c keeps vip2.
	n.a.Apply([]BalancerUpdate{{Name: "ns/a", Delete: true}, {Name: "ns/b", IPs: []netip.Addr{vipOff}}})
	for range 3 { // vipOff's probe and burst
		if _, p := parseARPWithLib(t, w.next(t)); p.TargetIP != vipOff {
			t.Fatalf("after the batch, a frame for %s, want only vipOff's announcement", p.TargetIP)
		}
	}
	w.send(t, arpRequest(t, vip1, ethernet.Broadcast)) // not answered any more
	w.send(t, arpRequest(t, vip2, ethernet.Broadcast)) // still ns/c's
	checkReply(t, w.next(t), eth0MAC, vip2)
	w.send(t, arpRequest(t, vipOff, ethernet.Broadcast))
	checkReply(t, w.next(t), eth0MAC, vipOff)
}
