package layer2

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var (
	vip6     = netip.MustParseAddr("2001:db8::10")
	vip6b    = netip.MustParseAddr("2001:db8::11")
	vip6Off  = netip.MustParseAddr("2001:db8::99")
	ll0      = "fe80::1"
	client6  = netip.MustParseAddr("fe80::c1")
	client6G = netip.MustParseAddr("2001:db8::c1")
)

// solicit builds a multicast Neighbor Solicitation from the client for
// target, with the source link-layer address option.
func solicit(t *testing.T, target netip.Addr) []byte {
	t.Helper()
	g := solicitedNodeGroup(target)
	mm := multicastMAC(g)
	return ipv6Frame(t, clientMAC, net.HardwareAddr(mm[:]), client6, g, &ndp.NeighborSolicitation{
		TargetAddress: target,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: clientMAC}},
	})
}

func checkNA(t *testing.T, b []byte, wantDstMAC net.HardwareAddr, wantDst, target netip.Addr, solicited, override bool) {
	t.Helper()
	dstMAC, src, dst, hop, m := decodeNDP(t, b)
	na, ok := m.(*ndp.NeighborAdvertisement)
	if !ok {
		t.Fatalf("sent %T, want a neighbor advertisement", m)
	}
	if dstMAC.String() != wantDstMAC.String() || dst != wantDst {
		t.Errorf("sent to %s/%s, want %s/%s", dstMAC, dst, wantDstMAC, wantDst)
	}
	if src != target || hop != 255 {
		t.Errorf("source %s hop limit %d, want the target %s and 255", src, hop, target)
	}
	if na.TargetAddress != target || na.Solicited != solicited || na.Override != override || na.Router {
		t.Errorf("advertisement %+v, want target %s solicited=%v override=%v", na, target, solicited, override)
	}
	if len(na.Options) != 1 {
		t.Fatalf("options %v, want one target link-layer address", na.Options)
	}
	lla, ok := na.Options[0].(*ndp.LinkLayerAddress)
	if !ok || lla.Direction != ndp.Target || lla.Addr.String() != eth0MAC {
		t.Errorf("option %+v, want target link-layer address %s", na.Options[0], eth0MAC)
	}
}

func TestNDPAnswersSolicitations(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ll0))
	n.a.SetBalancer("ns/a", []netip.Addr{vip6, vip1}, nil)
	n.a.SetBalancer("ns/b", []netip.Addr{vip6b}, nil)
	w := n.ndpEnd("eth0")

	if g := n.groups["eth0"]; !g.isJoined(solicitedNodeGroup(vip6)) || !g.isJoined(solicitedNodeGroup(vip6b)) {
		t.Fatalf("solicited-node groups not joined: %v", g.log)
	}

	// Multicast solicitation: solicited NA, unicast to the source link-layer
	// address option.
	w.send(t, solicit(t, vip6Off)) // not owned: nothing
	w.send(t, solicit(t, vip6))
	checkNA(t, w.next(t), clientMAC, client6, vip6, true, false)

	// Unicast NUD probe to the VIP itself, without a source link-layer
	// option: answered to the Ethernet source.
	nud := ipv6Frame(t, clientMAC, mustMAC(eth0MAC), client6G, vip6, &ndp.NeighborSolicitation{TargetAddress: vip6})
	w.send(t, nud)
	checkNA(t, w.next(t), clientMAC, client6G, vip6, true, false)

	// Duplicate address detection by another host: defend to all nodes.
	g := solicitedNodeGroup(vip6)
	mm := multicastMAC(g)
	dad := ipv6Frame(t, otherMAC, net.HardwareAddr(mm[:]), netip.IPv6Unspecified(), g, &ndp.NeighborSolicitation{TargetAddress: vip6})
	w.send(t, dad)
	checkNA(t, w.next(t), mustMAC("33:33:00:00:00:01"), ipv6AllNodes, vip6, false, true)

	// A solicitation for vip6 sent to another address is ignored.
	stray := ipv6Frame(t, clientMAC, mustMAC(eth0MAC), client6G, vip6b, &ndp.NeighborSolicitation{TargetAddress: vip6})
	w.send(t, stray)
	w.send(t, solicit(t, vip6b))
	checkNA(t, w.next(t), clientMAC, client6, vip6b, true, false)

	if got := testutil.ToFloat64(n.a.metrics.responses.WithLabelValues(vip6.String())); got != 3 {
		t.Errorf("responses_sent{ip=%s} = %v, want 3", vip6, got)
	}

	// Loss: no answer once DeleteBalancer returns, and the group is left.
	n.a.DeleteBalancer("ns/a")
	w.send(t, solicit(t, vip6))
	w.send(t, solicit(t, vip6b))
	checkNA(t, w.next(t), clientMAC, client6, vip6b, true, false)
	if n.groups["eth0"].isJoined(solicitedNodeGroup(vip6)) {
		t.Errorf("group of %s still joined after DeleteBalancer: %v", vip6, n.groups["eth0"].log)
	}
}

func TestNDPGroupRefcount(t *testing.T) {
	// ::10 and 2001:db8:1::10 share a solicited-node group.
	a, b := netip.MustParseAddr("2001:db8::aa:10"), netip.MustParseAddr("2001:db8:1::aa:10")
	if solicitedNodeGroup(a) != solicitedNodeGroup(b) {
		t.Fatal("test addresses must share a group")
	}
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ll0))
	n.a.SetBalancer("ns/a", []netip.Addr{a}, nil)
	n.a.SetBalancer("ns/b", []netip.Addr{b}, nil)
	n.a.DeleteBalancer("ns/a")
	g := n.groups["eth0"]
	if !g.isJoined(solicitedNodeGroup(b)) {
		t.Fatalf("group left while %s still owned: %v", b, g.log)
	}
	n.a.DeleteBalancer("ns/b")
	if g.isJoined(solicitedNodeGroup(b)) {
		t.Fatalf("group still joined: %v", g.log)
	}
	if len(g.log) != 2 {
		t.Errorf("joins/leaves %v, want one join and one leave", g.log)
	}
}

func TestUnsolicitedNAOnTakeover(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: 2, GratuitousInterval: 1_000_000}, testLink("eth0", 2, eth0MAC, ll0))
	n.a.SetBalancer("ns/a", []netip.Addr{vip6}, nil)
	w := n.ndpEnd("eth0")
	for range 2 {
		checkNA(t, w.next(t), mustMAC("33:33:00:00:00:01"), ipv6AllNodes, vip6, false, true)
	}
	waitFor(t, "gratuitous counter", func() bool {
		return testutil.ToFloat64(n.a.metrics.gratuitous.WithLabelValues(vip6.String())) == 2
	})
}

func TestNDPConflict(t *testing.T) {
	n := startTestNet(t, quiet, testLink("eth0", 2, eth0MAC, ll0))
	n.a.SetBalancer("ns/a", []netip.Addr{vip6}, nil)
	w := n.ndpEnd("eth0")
	na := ipv6Frame(t, otherMAC, mustMAC("33:33:00:00:00:01"), netip.MustParseAddr("fe80::99"), ipv6AllNodes, &ndp.NeighborAdvertisement{
		Override: true, TargetAddress: vip6,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: otherMAC}},
	})
	w.send(t, na)
	c := nextConflict(t, n.a)
	if c.IP != vip6 || c.MAC.String() != otherMAC.String() || c.Interface != "eth0" {
		t.Fatalf("conflict %+v, want %s at %s on eth0", c, vip6, otherMAC)
	}
}

func TestBuildNAMatchesLibrary(t *testing.T) {
	b, err := buildNA(mustMAC(eth0MAC), [6]byte(mustMAC(eth0MAC)), vip6, client6, [6]byte(clientMAC), vip6, true, false)
	if err != nil {
		t.Fatal(err)
	}
	var f ndpFrame
	if !parseNDP(b, &f) {
		t.Fatalf("our parser rejects our own advertisement")
	}
	if f.typ != icmpTypeNA || netip.AddrFrom16(f.target) != vip6 || !f.hasLLA || net.HardwareAddr(f.lla[:]).String() != eth0MAC || f.flags != 0x40 {
		t.Fatalf("parsed %+v", f)
	}
	checkNA(t, b, clientMAC, client6, vip6, true, false)
}

func TestNDPConflictGraceRecheck(t *testing.T) {
	n := startTestNet(t, Options{GratuitousCount: -1, ConflictGrace: 20 * time.Millisecond}, testLink("eth0", 2, eth0MAC, ll0))
	n.a.SetBalancer("ns/a", []netip.Addr{vip6}, nil)
	w := n.ndpEnd("eth0")
	na := ipv6Frame(t, otherMAC, mustMAC("33:33:00:00:00:01"), vip6, ipv6AllNodes, &ndp.NeighborAdvertisement{
		Override: true, TargetAddress: vip6,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: otherMAC}},
	})
	w.send(t, na)
	// The re-check is a duplicate address detection probe.
	dstMAC, src, dst, hop, m := decodeNDP(t, w.next(t))
	ns, ok := m.(*ndp.NeighborSolicitation)
	g := solicitedNodeGroup(vip6)
	mm := multicastMAC(g)
	if !ok || ns.TargetAddress != vip6 || len(ns.Options) != 0 || !src.IsUnspecified() || dst != g ||
		dstMAC.String() != net.HardwareAddr(mm[:]).String() || hop != 255 {
		t.Fatalf("want a DAD probe for %s to %s, got %T %+v from %s to %s/%s hop %d", vip6, g, m, m, src, dst, dstMAC, hop)
	}
	w.send(t, na) // the holder defends: reported
	if c := defendUntilReported(t, n.a, w, na); c.IP != vip6 || c.MAC.String() != otherMAC.String() {
		t.Fatalf("conflict %+v", c)
	}
}
