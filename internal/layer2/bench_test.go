package layer2

import (
	"net"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"
	"github.com/mdlayher/ethernet"
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
