//go:build linux

package layer2

// Real-socket tests of the SYN prober: the lab's namespace A is the owner
// (the VIPs on its loopback, TCP listeners on them), C the watcher probing
// through the veth pair.

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/mdlayher/packet"
)

const synTestPort = 8080

// synLab is a lab whose owner (A) holds the VIPs on its loopback, as
// kube-proxy's IPVS mode does on kube-ipvs0, so its kernel accepts
// connections to them arriving on the veth.
type synLab struct {
	*lab
	bogusMAC net.HardwareAddr
}

func newSYNLab(t testing.TB) *synLab {
	t.Helper()
	l := &synLab{lab: newLab(t), bogusMAC: mustMAC("02:1b:00:00:00:99")}
	run(t, "ip", "-n", l.nsA, "addr", "add", l.vip4.String()+"/32", "dev", "lo")
	run(t, "ip", "-n", l.nsA, "addr", "add", l.vip6.String()+"/128", "dev", "lo", "nodad")
	// The watcher's kernel answers each SYN-ACK (for a port it has no
	// socket on) with an RST of its own, sent to whatever its neighbour
	// table says the VIP is at. Point that at a MAC nobody has, so that
	// only the prober's RST, sent to the owner's MAC, can clear the
	// owner's half-open connection: the tests then show that it does.
	for _, vip := range []netip.Addr{l.vip4, l.vip6} {
		run(t, "ip", "-n", l.nsC, "neigh", "replace", vip.String(), "lladdr", l.bogusMAC.String(), "dev", l.ifC, "nud", "permanent")
	}
	return l
}

// listen opens a TCP listener on vip:synTestPort in the owner's namespace.
func (l *synLab) listen(t testing.TB, vip netip.Addr) *net.TCPListener {
	t.Helper()
	var ln net.Listener
	inNetns(t, l.nsA, func() {
		var err error
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(vip, synTestPort).String()); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = ln.Close() })
	return ln.(*net.TCPListener)
}

// probe runs one probe from the watcher's namespace (where the prober looks
// the interface up and opens its sockets).
func (l *synLab) probe(t testing.TB, p *SYNProber, pr SYNProbe) SYNProbeResult {
	t.Helper()
	var r SYNProbeResult
	inNetns(t, l.nsC, func() { r = p.Probe(context.Background(), pr) })
	return r
}

func (l *synLab) probeOf(vip netip.Addr, timeout time.Duration) SYNProbe {
	return SYNProbe{Interface: l.ifC, OwnerMAC: l.macA, VIP: netip.AddrPortFrom(vip, synTestPort), Timeout: timeout}
}

// expectNoAccept accepts on ln for d: no connection may come.
func expectNoAccept(t testing.TB, ln *net.TCPListener, d time.Duration) {
	t.Helper()
	_ = ln.SetDeadline(time.Now().Add(d))
	defer func() { _ = ln.SetDeadline(time.Time{}) }()
	for {
		c, err := ln.Accept()
		if err == nil {
			t.Errorf("the listener accepted a connection from %s", c.RemoteAddr())
			_ = c.Close()
			continue
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return
		}
		t.Fatalf("accept: %v", err)
	}
}

// halfOpen counts the owner's half-open (SYN_RECV) connections to
// synTestPort, from /proc/net/tcp and tcp6 of its namespace.
func (l *synLab) halfOpen(t testing.TB) int {
	t.Helper()
	out := run(t, "ip", "netns", "exec", l.nsA, "cat", "/proc/net/tcp", "/proc/net/tcp6")
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// sl local_address rem_address st ...; st 03 is SYN_RECV.
		if len(f) > 3 && f[3] == "03" && strings.HasSuffix(f[1], ":1F90") {
			n++
		}
	}
	return n
}

// waitHalfOpen polls until the owner has want half-open connections.
func (l *synLab) waitHalfOpen(t testing.TB, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	got := l.halfOpen(t)
	for got != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got = l.halfOpen(t)
	}
	if got != want {
		t.Fatalf("owner has %d half-open connections to port %d after %v, want %d", got, synTestPort, within, want)
	}
}

func TestNetnsSYNProbe(t *testing.T) {
	l := newSYNLab(t)
	p := NewSYNProber(testr.New(t), SYNProberOptions{})
	t.Cleanup(func() { _ = p.Close() })
	src := map[bool]netip.Addr{true: l.ip4C, false: netip.MustParseAddr("fd00:251::2")}

	t.Run("control: a SYN without an RST leaves a half-open connection, the RST clears it", func(t *testing.T) {
		ln := l.listen(t, l.vip4)
		var c *packet.Conn
		inNetns(t, l.nsC, func() {
			ifi, err := net.InterfaceByName(l.ifC)
			if err != nil {
				t.Fatal(err)
			}
			if c, err = packet.Listen(ifi, packet.Raw, etherTypeIPv4, nil); err != nil {
				t.Fatal(err)
			}
		})
		defer func() { _ = c.Close() }()
		var buf [tcpFrameMax]byte
		seg := tcpSegment{
			ethDst: [6]byte(l.macA), ethSrc: [6]byte(l.macC),
			src: netip.AddrPortFrom(l.ip4C, 40000), dst: netip.AddrPortFrom(l.vip4, synTestPort),
			seq: 1000, flags: tcpSYN, window: synWindow, mss: 1460,
		}
		to := &packet.Addr{HardwareAddr: l.macA}
		if _, err := c.WriteTo(writeTCP(buf[:], &seg), to); err != nil {
			t.Fatal(err)
		}
		l.waitHalfOpen(t, 1, 2*time.Second)
		seg.seq, seg.flags, seg.mss, seg.window = 1001, tcpRST, 0, 0
		if _, err := c.WriteTo(writeTCP(buf[:], &seg), to); err != nil {
			t.Fatal(err)
		}
		l.waitHalfOpen(t, 0, 2*time.Second)
		expectNoAccept(t, ln, 100*time.Millisecond)
	})

	listeners := map[netip.Addr]*net.TCPListener{}
	for _, vip := range []netip.Addr{l.vip4, l.vip6} {
		ln := l.listen(t, vip)
		listeners[vip] = ln
		t.Run(vip.String()+" answered, never accepted", func(t *testing.T) {
			r := l.probe(t, p, l.probeOf(vip, 5*time.Second))
			if r.Outcome != SYNAnswered || r.Src.Addr() != src[vip.Is4()] || r.Src.Port() < synPortMin {
				t.Fatalf("probe: %+v (%s), want answered from %s", r, r.Why(), src[vip.Is4()])
			}
			t.Logf("answered in %v from %s", r.RTT, r.Src)
			// The prober's RST went out before Probe returned: the owner
			// drops its half-open connection (the control above shows it
			// would otherwise stay), and the listener never sees one.
			l.waitHalfOpen(t, 0, time.Second)
			expectNoAccept(t, ln, 300*time.Millisecond)
		})
		t.Run(vip.String()+" concurrent probes", func(t *testing.T) {
			const n = 32
			var wg sync.WaitGroup
			res := make([]SYNProbeResult, n)
			for i := range n {
				wg.Go(func() { res[i] = l.probe(t, p, l.probeOf(vip, 5*time.Second)) })
			}
			wg.Wait()
			// Not all of them are in flight at once (a probe takes ~100 us),
			// so ports may repeat here; TestSYNProbeConcurrent checks that
			// probes in flight together never share one.
			for i, r := range res {
				if r.Outcome != SYNAnswered {
					t.Errorf("probe %d: %s", i, r.Why())
				}
			}
			l.waitHalfOpen(t, 0, time.Second)
			expectNoAccept(t, ln, 300*time.Millisecond)
		})
		t.Run(vip.String()+" wrong owner MAC", func(t *testing.T) {
			pr := l.probeOf(vip, 300*time.Millisecond)
			pr.OwnerMAC = make(net.HardwareAddr, 6)
			_, _ = rand.Read(pr.OwnerMAC)
			pr.OwnerMAC[0] = pr.OwnerMAC[0]&^1 | 2 // unicast, locally administered
			if r := l.probe(t, p, pr); r.Outcome != SYNTimeout {
				t.Fatalf("probe through %s: %s, want timeout", pr.OwnerMAC, r.Why())
			}
		})
	}
	for _, vip := range []netip.Addr{l.vip4, l.vip6} {
		t.Run(vip.String()+" refused once the listener is closed", func(t *testing.T) {
			_ = listeners[vip].Close()
			if r := l.probe(t, p, l.probeOf(vip, 5*time.Second)); r.Outcome != SYNRefused {
				t.Fatalf("probe: %s, want refused", r.Why())
			}
		})
	}
	t.Run("no address of the family", func(t *testing.T) {
		run(t, "ip", "-n", l.nsC, "addr", "del", "fd00:251::2/64", "dev", l.ifC)
		defer run(t, "ip", "-n", l.nsC, "addr", "add", "fd00:251::2/64", "dev", l.ifC, "nodad")
		time.Sleep(1100 * time.Millisecond) // LinkMaxAge
		if r := l.probe(t, p, l.probeOf(l.vip6, time.Second)); r.Outcome != SYNNoInterface {
			t.Fatalf("probe: %s, want noInterface", r.Why())
		}
		pr := l.probeOf(l.vip4, time.Second)
		pr.Interface = "ilbnosuch0"
		if r := l.probe(t, p, pr); r.Outcome != SYNNoInterface {
			t.Fatalf("probe on a missing interface: %s, want noInterface", r.Why())
		}
	})
	t.Run("owner's interface down", func(t *testing.T) {
		time.Sleep(1100 * time.Millisecond) // the IPv6 address is back
		run(t, "ip", "-n", l.nsA, "link", "set", l.ifA, "down")
		for _, vip := range []netip.Addr{l.vip4, l.vip6} {
			if r := l.probe(t, p, l.probeOf(vip, 300*time.Millisecond)); r.Outcome != SYNTimeout {
				t.Errorf("probe of %s: %s, want timeout", vip, r.Why())
			}
		}
	})
}

// BenchmarkNetnsSYNProbe is the cost of one answered probe through the veth
// pair: SYN out, SYN-ACK back, RST out, the owner's kernel doing its part.
func BenchmarkNetnsSYNProbe(b *testing.B) {
	l := newSYNLab(b)
	l.listen(b, l.vip4)
	p := NewSYNProber(logr.Discard(), SYNProberOptions{})
	defer func() { _ = p.Close() }()
	pr := l.probeOf(l.vip4, 5*time.Second)
	inNetns(b, l.nsC, func() {
		for range 10 { // warm up: socket, neighbour entries
			if r := p.Probe(context.Background(), pr); r.Outcome != SYNAnswered {
				b.Fatalf("warm-up probe: %s", r.Why())
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if r := p.Probe(context.Background(), pr); r.Outcome != SYNAnswered {
				b.Fatalf("probe: %s", r.Why())
			}
		}
	})
}
