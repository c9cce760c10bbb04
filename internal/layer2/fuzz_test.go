package layer2

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
)

// Seeds shared by the committed corpus (testdata/fuzz) and f.Add.
func arpSeeds(t testing.TB) [][]byte {
	mk := func(op arp.Operation, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr, dst net.HardwareAddr) []byte {
		b, err := arpFrameBytes(op, sha, spa, tha, tpa, dst)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	zero := make(net.HardwareAddr, 6)
	garp, err := gratuitousARP(otherMAC, vip1)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := arpProbe(clientMAC, vip1)
	if err != nil {
		t.Fatal(err)
	}
	req := mk(arp.OperationRequest, clientMAC, clientIP, zero, vip1, ethernet.Broadcast)
	return [][]byte{
		req,
		mk(arp.OperationRequest, clientMAC, clientIP, zero, vipOff, ethernet.Broadcast),
		mk(arp.OperationReply, otherMAC, vip1, clientMAC, clientIP, clientMAC),
		garp[0], garp[1], probe,
		req[:42], req[:41], {},
	}
}

func ndpSeeds(t testing.TB) [][]byte {
	g := solicitedNodeGroup(vip6)
	mm := multicastMAC(g)
	ns := ipv6Frame(t, clientMAC, net.HardwareAddr(mm[:]), client6, g, &ndp.NeighborSolicitation{
		TargetAddress: vip6, Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: clientMAC}},
	})
	nud := ipv6Frame(t, clientMAC, mustMAC(eth0MAC), client6G, vip6, &ndp.NeighborSolicitation{TargetAddress: vip6})
	na, err := buildNA(otherMAC, [6]byte(otherMAC), netip.MustParseAddr("fe80::99"), ipv6AllNodes, multicastMAC(ipv6AllNodes), vip6, false, true)
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{ns, nud, na, ns[:60], ns[:78], {}}
}

// TestWriteFuzzSeeds regenerates testdata/fuzz when ILB_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("ILB_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set ILB_WRITE_FUZZ_SEEDS=1 to regenerate the committed fuzz corpus")
	}
	write := func(fuzz string, seeds [][]byte) {
		dir := filepath.Join("testdata", "fuzz", fuzz)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			c := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%02d", i)), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("FuzzParseARP", arpSeeds(t))
	write("FuzzHandleARP", arpSeeds(t))
	write("FuzzParseNDP", ndpSeeds(t))
	write("FuzzHandleNDP", ndpSeeds(t))
	write("FuzzProbeAnswer", probeAnswerSeeds(t))
}

// FuzzParseARP checks the fast-path parser against mdlayher/arp: whatever we
// accept, the library decodes to the same fields.
func FuzzParseARP(f *testing.F) {
	for _, s := range arpSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr arpFrame
		if !parseARP(b, &fr) {
			return
		}
		var p arp.Packet
		if err := p.UnmarshalBinary(b[ethHeaderLen:]); err != nil {
			t.Fatalf("we accept a frame mdlayher/arp rejects: %v", err)
		}
		if uint16(p.Operation) != fr.op || p.SenderHardwareAddr.String() != net.HardwareAddr(fr.sha[:]).String() ||
			p.SenderIP != v4addr(fr.spa) || p.TargetIP != v4addr(fr.tpa) {
			t.Fatalf("fields differ: ours %+v, library %+v", fr, p)
		}
	})
}

// FuzzParseNDP checks the NDP parser never panics and agrees with
// mdlayher/ndp on the message type and target when both accept.
func FuzzParseNDP(f *testing.F) {
	for _, s := range ndpSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr ndpFrame
		if !parseNDP(b, &fr) {
			return
		}
		plen := int(b[18])<<8 | int(b[19])
		m, err := ndp.ParseMessage(b[54 : 54+plen])
		if err != nil {
			return // the library is stricter about option contents
		}
		var target netip.Addr
		switch m := m.(type) {
		case *ndp.NeighborSolicitation:
			target = m.TargetAddress
			if fr.typ != icmpTypeNS {
				t.Fatalf("type %d, library says NS", fr.typ)
			}
		case *ndp.NeighborAdvertisement:
			target = m.TargetAddress
			if fr.typ != icmpTypeNA {
				t.Fatalf("type %d, library says NA", fr.typ)
			}
		default:
			t.Fatalf("we accept a %T", m)
		}
		if target != netip.AddrFrom16(fr.target) {
			t.Fatalf("target %s, library %s", netip.AddrFrom16(fr.target), target)
		}
	})
}

// recordConn records writes; reads are never used.
type recordConn struct {
	mu     sync.Mutex
	writes [][]byte
}

func (c *recordConn) ReadFrom([]byte) (int, net.Addr, error) { return 0, nil, net.ErrClosed }
func (c *recordConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, append([]byte(nil), b...))
	return len(b), nil
}
func (c *recordConn) Close() error                     { return nil }
func (c *recordConn) LocalAddr() net.Addr              { return nil }
func (c *recordConn) SetDeadline(time.Time) error      { return nil }
func (c *recordConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordConn) SetWriteDeadline(time.Time) error { return nil }

// fuzzResponder is a responder owning vip1 and vip6 on eth0, writing to rc.
func fuzzResponder(rc *recordConn) *responder {
	m := newMetrics(prometheus.NewRegistry())
	r := &responder{
		log:      logr.Discard(),
		link:     testLink("eth0", 2, eth0MAC, ll0),
		mac:      [6]byte(mustMAC(eth0MAC)),
		arp:      rc,
		ndp:      rc,
		isLocal:  func([6]byte) bool { return false },
		conflict: func(*ownedIP, [6]byte, string) {},
		held:     func() bool { return false },
	}
	ed := editSet(nil)
	ed.add(&ownedIP{addr: vip1, m: m.forIP(vip1)})
	ed.add(&ownedIP{addr: vip6, m: m.forIP(vip6)})
	r.owned.Store(ed.s)
	return r
}

// proxyResponder is fuzzResponder answering vip1 and vip6 for xMAC.
func proxyResponder(rc *recordConn) *responder {
	r := fuzzResponder(rc)
	ed := editSet(r.owned.Load())
	for _, ip := range []netip.Addr{vip1, vip6} {
		ed.add(&ownedIP{addr: ip, m: r.owned.Load().get(ip).m, proxied: true, mac: [6]byte(xMAC)})
	}
	r.owned.Store(ed.s)
	return r
}

// FuzzHandleARP runs the whole ARP policy on arbitrary frames: it never
// panics, and it only ever sends a reply for vip1 to a request for vip1.
func FuzzHandleARP(f *testing.F) {
	for _, s := range arpSeeds(f) {
		f.Add(s)
	}
	rc, prc := &recordConn{}, &recordConn{}
	r, pr := fuzzResponder(rc), proxyResponder(prc)
	h, ph := r.serveARPFrame(), pr.serveARPFrame()
	// check: at most one reply, only to a request for vip1 (not from the
	// proxied host), from our MAC, with sender hardware address sha.
	check := func(t *testing.T, b []byte, writes [][]byte, sha [6]byte) {
		if len(writes) == 0 {
			return
		}
		var fr arpFrame
		if !parseARP(b, &fr) || fr.op != arpOpRequest || fr.tpa != v4key(vip1) || fr.sha == [6]byte(xMAC) && sha == [6]byte(xMAC) {
			t.Fatalf("replied to a frame that is not a request for %s: % x", vip1, b)
		}
		var rep arpFrame
		if len(writes) != 1 || !parseARP(writes[0], &rep) || rep.op != arpOpReply || rep.spa != v4key(vip1) || rep.sha != sha ||
			[6]byte(writes[0][6:12]) != r.mac {
			t.Fatalf("bad reply % x", writes)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rc.writes, prc.writes = rc.writes[:0], prc.writes[:0]
		h(b)
		check(t, b, rc.writes, r.mac)
		ph(b)
		check(t, b, prc.writes, [6]byte(xMAC))
	})
}

// FuzzHandleNDP runs the NDP policy on arbitrary frames: no panic, and only
// advertisements for vip6 carrying our MAC are sent.
func FuzzHandleNDP(f *testing.F) {
	for _, s := range ndpSeeds(f) {
		f.Add(s)
	}
	rc, prc := &recordConn{}, &recordConn{}
	r, pr := fuzzResponder(rc), proxyResponder(prc)
	h, ph := r.serveNDPFrame(), pr.serveNDPFrame()
	f.Fuzz(func(t *testing.T, b []byte) {
		rc.writes, prc.writes = rc.writes[:0], prc.writes[:0]
		h(b)
		ph(b)
		for _, w := range rc.writes {
			var fr ndpFrame
			if !parseNDP(w, &fr) || fr.typ != icmpTypeNA || netip.AddrFrom16(fr.target) != vip6 || !fr.hasLLA || fr.lla != r.mac {
				t.Fatalf("sent something other than an advertisement for %s: % x", vip6, w)
			}
		}
		// Proxy answers: our Ethernet source, the proxied MAC in the
		// option, never the Override or Router flag.
		for _, w := range prc.writes {
			var fr ndpFrame
			if !parseNDP(w, &fr) || fr.typ != icmpTypeNA || netip.AddrFrom16(fr.target) != vip6 || !fr.hasLLA ||
				fr.lla != [6]byte(xMAC) || fr.ethSrc != r.mac || fr.flags&0xa0 != 0 {
				t.Fatalf("sent something other than a proxy advertisement for %s: % x", vip6, w)
			}
		}
	})
}

// FuzzProbeAnswer runs the Prober's answer handlers on arbitrary frames
// while probes for vip1 and vip6 wait: an answer is delivered only for an
// ARP reply to a probe (target IP 0.0.0.0) from vip1, or a solicited
// advertisement for vip6 to our link-local address and MAC.
func FuzzProbeAnswer(f *testing.F) {
	for _, s := range probeAnswerSeeds(f) {
		f.Add(s)
	}
	l := probeLink("eth0", 2, eth0MAC)
	pi := &probeIface{log: logr.Discard(), link: l, mac: [6]byte(l.MAC), targets: map[netip.Addr]*probeTarget{}}
	w := &probeWaiter{ch: make(chan probeAnswer, 1)}
	pi.register(vip1, w)
	pi.register(vip6, w)
	ha, hn := pi.handleARP(), pi.handleNDP()
	f.Fuzz(func(t *testing.T, b []byte) {
		ha(b)
		hn(b)
		select {
		case a := <-w.ch:
			var af arpFrame
			var nf ndpFrame
			okARP := parseARP(b, &af) && af.op == arpOpReply && af.tpa == 0 && af.spa == v4key(vip1) && af.sha == a.mac
			okNDP := parseNDP(b, &nf) && nf.typ == icmpTypeNA && nf.flags&naFlagSolicited != 0 && netip.AddrFrom16(nf.target) == vip6 &&
				nf.ethDst == pi.mac && nf.dst == l.LinkLocal.As16()
			if !okARP && !okNDP {
				t.Fatalf("answer %+v delivered for % x", a, b)
			}
		default:
		}
	})
}

func probeAnswerSeeds(t testing.TB) [][]byte {
	probe, err := arpProbe(mustMAC(eth0MAC), vip1)
	if err != nil {
		t.Fatal(err)
	}
	answer := arpProbeAnswer(probe, hostMAC, vip1)
	na := ipv6Frame(t, hostMAC, mustMAC(eth0MAC), vip6, netip.MustParseAddr(ll0), &ndp.NeighborAdvertisement{
		Solicited: true, TargetAddress: vip6, Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: hostMAC}},
	})
	return append(append(arpSeeds(t), ndpSeeds(t)...), answer, na, answer[:41], na[:70])
}
