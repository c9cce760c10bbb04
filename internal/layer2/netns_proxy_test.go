//go:build linux

package layer2

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNetnsProxy: a deputy answers for host X's IPs on a bridge. The
// client's kernel resolves them to X's MAC, while the bridge learns only the
// deputy's own MAC on the deputy's port: the Ethernet source of a proxy
// answer is the deputy's.
func TestNetnsProxy(t *testing.T) {
	l := newLab(t)
	deputy := &bridgeHost{ns: l.nsA, ifname: "ilbl2" + l.id + "x", mac: mustMAC("02:1b:00:00:02:0d"),
		addrs: []string{"10.251.0.1/24", "fd00:251::1/64"}}
	// X sends nothing on its own (no IPv6 chatter): any frame with X's
	// MAC as source during the test is one the deputy sent.
	x := &bridgeHost{ns: "ilb-l2t-" + l.id + "-x", ifname: "ilbl2" + l.id + "y", mac: mustMAC("02:1b:00:00:02:0e"),
		addrs: []string{"10.251.0.3/24"}, noIPv6: true}
	client := &bridgeHost{ns: l.nsC, ifname: "ilbl2" + l.id + "z", mac: mustMAC("02:1b:00:00:02:0c"),
		addrs: []string{"10.251.0.2/24", "fd00:251::2/64"}}
	sw, _ := l.bridge(t, []*bridgeHost{deputy, x, client})
	h := startAnnouncerIn(t, deputy.ns, deputy.ifname)

	// X talks on the segment (its kernel is alive, resolving the client),
	// so the bridge knows its MAC on X's port, as a switch would.
	sendUDP(t, x.ns, netip.MustParseAddr("10.251.0.2"))

	if got := h.do(t, "proxy node-x "+l.vip4.String()+","+l.vip6.String()+" "+deputy.ifname+"="+x.mac.String()); got != "ok" {
		t.Fatalf("proxy: %s", got)
	}
	fdb := func(port string) string {
		return strings.ToLower(run(t, "bridge", "-n", sw, "fdb", "show", "brport", port))
	}
	waitFor(t, "X's MAC on X's port", func() bool { return strings.Contains(fdb(x.port), x.mac.String()) })

	// The client's kernel resolves the VIPs itself: no gratuitous
	// announcement helps it. The answers come through the deputy's port:
	// the bridge learns the deputy's MAC there (the positive control),
	// never X's.
	for _, vip := range []netip.Addr{l.vip4, l.vip6} {
		family := "-4"
		if vip.Is6() {
			family = "-6"
		}
		t.Run("client resolves "+vip.String()+" to X's MAC", func(t *testing.T) {
			sendUDP(t, client.ns, vip)
			waitNeighOn(t, client.ns, client.ifname, family, vip, x.mac)
			waitFor(t, "the deputy's MAC on its port", func() bool { return strings.Contains(fdb(deputy.port), deputy.mac.String()) })
			if got := fdb(deputy.port); strings.Contains(got, x.mac.String()) {
				t.Fatalf("bridge learned X's MAC %s on the deputy's port %s:\n%s", x.mac, deputy.port, got)
			}
			if got := fdb(x.port); !strings.Contains(got, x.mac.String()) {
				t.Fatalf("X's MAC %s moved off X's port %s:\n%s", x.mac, x.port, got)
			}
		})
	}

	t.Run("not answered after DeleteProxy", func(t *testing.T) {
		if got := h.do(t, "unproxy node-x"); got != "ok" {
			t.Fatalf("unproxy: %s", got)
		}
		c := clientConnOn(t, client.ns, client.ifname)
		req, _ := arpFrameBytesFor(client.mac, netip.MustParseAddr("10.251.0.2"), l.vip4)
		if mac, _, err := l.resolve(c, req, l.vip4, make([]byte, 128), 500*time.Millisecond); err == nil {
			t.Fatalf("deleted proxy IP still answered with %s", mac)
		}
	})
}

// TestNetnsHandoverYields: a node that gave an IP away keeps answering for
// it (the client's kernel resolves it to that node) until the new owner's
// gratuitous ARP, seen on the real segment, ends the hand-over: once the new
// owner stops answering too, nobody answers, and no conflict was reported.
func TestNetnsHandoverYields(t *testing.T) {
	l := newLab(t)
	hosts, a, b := l.twoAnnouncers(t, 3)
	client := hosts[2]
	vip := l.vip4.String()
	for _, cmd := range []string{"set svc " + vip, "handover h " + vip, "del svc"} {
		if got := a.do(t, cmd); got != "ok" {
			t.Fatalf("a %s: %s", cmd, got)
		}
	}
	c := clientConnOn(t, client.ns, client.ifname)
	req, _ := arpFrameBytesFor(client.mac, netip.MustParseAddr("10.251.0.2"), l.vip4)
	buf := make([]byte, 128)
	if mac, _, err := l.resolve(c, req, l.vip4, buf, 2*time.Second); err != nil || mac.String() != hosts[0].mac.String() {
		t.Fatalf("handed-over IP resolved to %s (%v), want the old owner's %s", mac, err, hosts[0].mac)
	}
	sendUDP(t, client.ns, l.vip4)
	waitNeighOn(t, client.ns, client.ifname, "-4", l.vip4, hosts[0].mac)

	if got := b.do(t, "set svc "+vip); got != "ok" {
		t.Fatalf("b set: %s", got)
	}
	waitNeighOn(t, client.ns, client.ifname, "-4", l.vip4, hosts[1].mac)
	if got := b.do(t, "del svc"); got != "ok" {
		t.Fatalf("b del: %s", got)
	}
	// Three requests in a row unanswered: one reply lost on a busy
	// machine must not pass for the end of the hand-over.
	unanswered := 0
	waitFor(t, "nobody answering once the new owner announced and then let go", func() bool {
		if _, _, err := l.resolve(c, req, l.vip4, buf, 300*time.Millisecond); err != nil {
			unanswered++
		} else {
			unanswered = 0
		}
		return unanswered >= 3
	})
	for len(a.lines) > 0 {
		if line := <-a.lines; strings.HasPrefix(line, "conflict ") {
			t.Fatalf("the new owner's announcement was reported as a conflict: %s", line)
		}
	}
	if len(a.seen) > 0 {
		t.Fatalf("the new owner's announcement was reported as a conflict: %v", a.seen)
	}
}

// TestNetnsProber probes a live namespace's kernel (IPv4, and IPv6 on an
// address that is not the first on either interface), checks that an IPv4
// probe leaves the target's neighbour table alone, then takes the target's
// link down.
func TestNetnsProber(t *testing.T) {
	l := newLab(t)
	// Second prefixes on both ends: the prober's match and the target's
	// address are both not the first on their interface.
	run(t, "ip", "-n", l.nsA, "addr", "add", "fd00:252::1/64", "dev", l.ifA, "nodad")
	run(t, "ip", "-n", l.nsC, "addr", "add", "fd00:252::2/64", "dev", l.ifC, "nodad")
	h := l.startAnnouncer(t)
	probe := func(addr string) string { return h.do(t, "probe "+addr) }
	reachable := "reachable " + l.ifA + " " + l.macC.String()

	t.Run("netlink link state", func(t *testing.T) {
		var links []Link
		var err error
		inNetns(t, l.nsA, func() { links, err = netlinkLinks() })
		if err != nil {
			t.Fatal(err)
		}
		got := findLink(t, links, l.ifA)
		want := []netip.Prefix{netip.MustParsePrefix("10.251.0.1/24"), netip.MustParsePrefix("fd00:251::1/64"), netip.MustParsePrefix("fd00:252::1/64")}
		if !got.Carrier || !got.Up || !slices.Equal(got.Prefixes, want) || !got.LinkLocal.IsLinkLocalUnicast() {
			t.Fatalf("link %+v, want carrier, up, prefixes %v and a link-local address", got, want)
		}
	})
	// The target's IPv6 addresses become usable once its link has carrier,
	// which the kernel signals asynchronously: poll.
	for _, addr := range []string{l.ip4C.String(), "fd00:251::2", "fd00:252::2"} {
		t.Run("live kernel answers for "+addr, func(t *testing.T) {
			var got string
			deadline := time.Now().Add(10 * time.Second)
			for got = probe(addr); got != "probe "+addr+" "+reachable; got = probe(addr) {
				if time.Now().After(deadline) {
					t.Fatalf("%s, want %s", got, reachable)
				}
			}
		})
	}
	t.Run("the IPv4 probe did not touch the target's neighbour table", func(t *testing.T) {
		if out := run(t, "ip", "-n", l.nsC, "-4", "neigh", "show", "dev", l.ifC); strings.TrimSpace(out) != "" {
			t.Fatalf("target learned a neighbour from an RFC 5227 probe: %q", out)
		}
	})
	t.Run("off-link address", func(t *testing.T) {
		if got := probe("10.252.0.2"); got != "probe 10.252.0.2 unreachable "+ProbeNoInterface.String() {
			t.Fatalf("%s", got)
		}
	})

	run(t, "ip", "-n", l.nsC, "link", "set", l.ifC, "down")
	t.Run("netlink sees the carrier lost", func(t *testing.T) {
		waitFor(t, "no carrier on "+l.ifA, func() bool {
			var links []Link
			var err error
			inNetns(t, l.nsA, func() { links, err = netlinkLinks() })
			return err == nil && !findLink(t, links, l.ifA).Carrier
		})
	})
	for _, addr := range []string{l.ip4C.String(), "fd00:252::2"} {
		t.Run("link down: "+addr+" not reachable", func(t *testing.T) {
			got := probe(addr)
			if !strings.HasPrefix(got, "probe "+addr+" unreachable ") {
				t.Fatalf("%s, want unreachable", got)
			}
			t.Logf("%s", got)
		})
	}
}

// sendUDP sends one datagram to addr's discard port from namespace ns, so
// that its kernel resolves addr (nothing needs to receive it).
func sendUDP(t *testing.T, ns string, addr netip.Addr) {
	t.Helper()
	inNetns(t, ns, func() {
		c, err := net.Dial("udp", net.JoinHostPort(addr.String(), "9"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		_, _ = c.Write([]byte("x"))
	})
}

func findLink(t *testing.T, links []Link, name string) Link {
	t.Helper()
	for _, l := range links {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("no link %s in %+v", name, links)
	return Link{}
}
