package layer2

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
)

// nullConn discards writes.
type nullConn struct{ recordConn }

func (*nullConn) WriteTo(b []byte, _ net.Addr) (int, error) { return len(b), nil }

// benchResponder owns vip1 and 99 other IPs, like a node with 100 VIPs.
func benchResponder() *responder {
	r := fuzzResponder(nil)
	r.arp, r.ndp = &nullConn{}, &nullConn{}
	m := newMetrics(prometheus.NewRegistry())
	ed := editSet(nil)
	for i := range 100 {
		ip := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
		ed.add(&ownedIP{addr: ip, m: m.forIP(ip)})
	}
	ed.add(&ownedIP{addr: vip6, m: m.forIP(vip6)})
	r.owned.Store(ed.s)
	return r
}

// BenchmarkARPFloodNotOwned is the per-frame cost of a request for an IP we
// do not own: the 50k req/s flood case.
func BenchmarkARPFloodNotOwned(b *testing.B) {
	r := benchResponder()
	h := r.serveARPFrame()
	f := arpRequest(&testing.T{}, netip.MustParseAddr("198.51.100.7"), ethernet.Broadcast)
	b.ReportAllocs()
	for b.Loop() {
		h(f)
	}
}

// BenchmarkARPOwned is the per-frame cost of answering a request for an
// owned IP (parse, lookup, counters, build reply, write to a null conn).
func BenchmarkARPOwned(b *testing.B) {
	r := benchResponder()
	h := r.serveARPFrame()
	f := arpRequest(&testing.T{}, vip1, ethernet.Broadcast)
	b.ReportAllocs()
	for b.Loop() {
		h(f)
	}
}

// BenchmarkNDPNotOwned and BenchmarkNDPOwned are the IPv6 equivalents.
func BenchmarkNDPNotOwned(b *testing.B) {
	r := benchResponder()
	h := r.serveNDPFrame()
	f := solicit(&testing.T{}, vip6Off)
	b.ReportAllocs()
	for b.Loop() {
		h(f)
	}
}

func BenchmarkNDPOwned(b *testing.B) {
	r := benchResponder()
	h := r.serveNDPFrame()
	f := solicit(&testing.T{}, vip6)
	b.ReportAllocs()
	for b.Loop() {
		h(f)
	}
}

// BenchmarkSetBalancer is the cost of one ownership change with 1,000 IPs
// owned on 2 interfaces (the owned sets are rebuilt and swapped).
func BenchmarkSetBalancer(b *testing.B) {
	a := NewAnnouncer(logr.Discard(), Options{GratuitousCount: -1})
	for i := range 2 {
		r := &responder{link: testLink([]string{"eth0", "eth1"}[i], 2+i, eth0MAC, ""), arp: &nullConn{}, groups: map[netip.Addr]int{}}
		a.responders[r.link.Name] = r
	}
	for i := range 1000 {
		a.SetBalancer(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String(), []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}, nil)
	}
	b.ReportAllocs()
	for b.Loop() {
		a.SetBalancer("x", []netip.Addr{vip1}, nil)
		a.DeleteBalancer("x")
	}
}

// BenchmarkARPProxied is BenchmarkARPOwned for an IP answered on another
// host's behalf (SetProxy): the same path, with the proxied MAC in the
// payload.
func BenchmarkARPProxied(b *testing.B) {
	r := benchResponder()
	set := r.owned.Load()
	ed := editSet(set)
	ed.add(&ownedIP{addr: vip1, m: set.get(vip1).m, proxied: true, mac: [6]byte(xMAC)})
	r.owned.Store(ed.s)
	h := r.serveARPFrame()
	f := arpRequest(&testing.T{}, vip1, ethernet.Broadcast)
	b.ReportAllocs()
	for b.Loop() {
		h(f)
	}
}

// BenchmarkProberReply is the Prober's cost per answer handled: parse,
// match the answering IP among 100 probed addresses, learn its MAC, wake the
// waiting call (which the benchmark then drains).
func BenchmarkProberReply(b *testing.B) {
	for _, family := range []string{"ARP", "NDP"} {
		b.Run(family, func(b *testing.B) {
			l := probeLink("eth0", 2, eth0MAC)
			pi := &probeIface{log: logr.Discard(), link: l, mac: [6]byte(l.MAC), targets: map[netip.Addr]*probeTarget{}}
			w := &probeWaiter{ch: make(chan probeAnswer, 1)}
			for i := range 100 {
				pi.register(netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)}), w)
				pi.register(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(100 + i)}), w)
			}
			addr4, addr6 := netip.AddrFrom4([4]byte{192, 0, 2, 150}), netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 150})
			probe, _ := arpProbe(mustMAC(eth0MAC), addr4)
			h, frame := pi.handleARP(), arpProbeAnswer(probe, hostMAC, addr4)
			if family == "NDP" {
				h = pi.handleNDP()
				frame = ipv6Frame(b, hostMAC, mustMAC(eth0MAC), addr6, netip.MustParseAddr(ll0), &ndp.NeighborAdvertisement{
					Solicited: true, TargetAddress: addr6, Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: hostMAC}},
				})
			}
			b.ReportAllocs()
			for b.Loop() {
				h(frame)
				<-w.ch
			}
		})
	}
}

// BenchmarkProberProbe is one whole answered Probe call over an in-memory
// link, with a goroutine playing the host's kernel: link lookup (cached),
// waiter registration, the probe write, the answer's read and delivery.
func BenchmarkProberProbe(b *testing.B) {
	ours, theirs := memPipe()
	p := NewProber(logr.Discard(), ProberOptions{
		Interval:  10 * time.Second,
		Links:     func() ([]Link, error) { return []Link{probeLink("eth0", 2, eth0MAC)}, nil },
		ListenARP: func(Link) (net.PacketConn, error) { return ours, nil },
	})
	defer func() { _ = p.Close() }()
	go func() {
		for {
			select {
			case f := <-theirs.in:
				_, _ = theirs.WriteTo(arpProbeAnswer(f, hostMAC, hostIP), nil)
			case <-theirs.closed:
				return
			}
		}
	}()
	defer func() { _ = theirs.Close() }()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if r := p.Probe(ctx, hostIP); !r.Reachable {
			b.Fatalf("%+v", r)
		}
	}
}

// BenchmarkTakeover is the announcer's part of a takeover: a node that owns
// 500 IPs on 2 interfaces takes over another 500 (a dead owner's), one
// SetBalancer per Service ("oneByOne") or in one Apply ("batch"), and gives
// them back.
func BenchmarkTakeover(b *testing.B) {
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}) }
	setup := func() *Announcer {
		a := NewAnnouncer(logr.Discard(), Options{GratuitousCount: -1})
		for i := range 2 {
			r := &responder{link: testLink([]string{"eth0", "eth1"}[i], 2+i, eth0MAC, ""), arp: &nullConn{}, groups: map[netip.Addr]int{}}
			a.responders[r.link.Name] = r
		}
		for i := range 500 {
			a.SetBalancer(ip(i).String(), []netip.Addr{ip(i)}, nil)
		}
		return a
	}
	var take, give []BalancerUpdate
	for i := 500; i < 1000; i++ {
		take = append(take, BalancerUpdate{Name: ip(i).String(), IPs: []netip.Addr{ip(i)}})
		give = append(give, BalancerUpdate{Name: ip(i).String(), Delete: true})
	}
	b.Run("oneByOne", func(b *testing.B) {
		a := setup()
		b.ReportAllocs()
		for b.Loop() {
			for _, u := range take {
				a.SetBalancer(u.Name, u.IPs, nil)
			}
			for _, u := range give {
				a.DeleteBalancer(u.Name)
			}
		}
	})
	b.Run("batch", func(b *testing.B) {
		a := setup()
		b.ReportAllocs()
		for b.Loop() {
			a.Apply(take)
			a.Apply(give)
		}
	})
}
