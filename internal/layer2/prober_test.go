package layer2

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/mdlayher/ndp"
)

// probeNet runs a Prober over in-memory links; the test plays the hosts on
// the network ends.
type probeNet struct {
	p     *Prober
	mu    sync.Mutex
	links []Link
	arp   map[string]*memConn
	ndp   map[string]*memConn
	opens int
}

var (
	hostIP   = netip.MustParseAddr("192.0.2.20")
	hostIP2  = netip.MustParseAddr("192.0.2.21")
	hostMAC  = mustMAC("02:00:00:00:00:b1")
	hostMAC2 = mustMAC("02:00:00:00:00:b2")
	host6    = netip.MustParseAddr("2001:db8::20")
)

// probeLink is eth0 with 192.0.2.2/24 and 2001:db8::2/64 on it.
func probeLink(name string, idx int, mac string) Link {
	l := testLink(name, idx, mac, ll0)
	l.Carrier = true
	l.Prefixes = []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("2001:db8::2/64")}
	return l
}

func startProbeNet(t *testing.T, opts ProberOptions, links ...Link) *probeNet {
	t.Helper()
	n := &probeNet{links: links, arp: map[string]*memConn{}, ndp: map[string]*memConn{}}
	opts.Links = func() ([]Link, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return slices.Clone(n.links), nil
	}
	listen := func(m map[string]*memConn) func(Link) (net.PacketConn, error) {
		return func(l Link) (net.PacketConn, error) {
			ours, theirs := memPipe()
			n.mu.Lock()
			defer n.mu.Unlock()
			m[l.Name] = theirs
			n.opens++
			return ours, nil
		}
	}
	opts.ListenARP, opts.ListenNDP = listen(n.arp), listen(n.ndp)
	n.p = NewProber(testr.New(t), opts)
	t.Cleanup(func() { _ = n.p.Close() })
	return n
}

func (n *probeNet) end(m map[string]*memConn, name string) *memConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return m[name]
}

// probeAnswer builds a host's kernel answer to an ARP probe (op reply,
// target IP 0.0.0.0, unicast to the prober), as Linux sends it.
func arpProbeAnswer(probe []byte, mac net.HardwareAddr, ip netip.Addr) []byte {
	var f arpFrame
	if !parseARP(probe, &f) {
		panic("not an ARP probe")
	}
	return appendARP(make([]byte, minFrameLen), arpOpReply, f.sha, [6]byte(mac), [6]byte(mac), v4key(ip), f.sha, 0)
}

// checkARPProbe checks a probe: RFC 5227 form from our MAC, for ip, to ethDst.
func checkARPProbe(t *testing.T, b []byte, ip netip.Addr, ethDst net.HardwareAddr) {
	t.Helper()
	f, p := parseARPWithLib(t, b)
	if p.Operation != 1 || p.SenderIP != netip.IPv4Unspecified() || p.TargetIP != ip || p.SenderHardwareAddr.String() != eth0MAC ||
		f.Source.String() != eth0MAC || f.Destination.String() != ethDst.String() || p.TargetHardwareAddr.String() != "00:00:00:00:00:00" {
		t.Fatalf("want an RFC 5227 probe for %s from %s to %s, got eth %s -> %s, %+v", ip, eth0MAC, ethDst, f.Source, f.Destination, p)
	}
}

// probeAsync runs Probe in the background.
func probeAsync(p *Prober, ctx context.Context, addr netip.Addr) <-chan ProbeResult {
	ch := make(chan ProbeResult, 1)
	go func() { ch <- p.Probe(ctx, addr) }()
	return ch
}

func result(t *testing.T, ch <-chan ProbeResult) ProbeResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Probe did not return within 10s")
		return ProbeResult{}
	}
}

func TestProberIPv4(t *testing.T) {
	// A long interval: an answered probe never depends on timing.
	n := startProbeNet(t, ProberOptions{Interval: 10 * time.Second, Attempts: 3}, probeLink("eth0", 2, eth0MAC))
	ctx := context.Background()

	ch := probeAsync(n.p, ctx, hostIP)
	w := waitEnd(t, n, n.arp, "eth0")
	probe := w.next(t)
	checkARPProbe(t, probe, hostIP, mustMAC("ff:ff:ff:ff:ff:ff"))
	// Answers that do not count: another host's, a gratuitous reply, a
	// request. Then the right one.
	w.send(t, arpProbeAnswer(probe, hostMAC2, hostIP2))
	garp, _ := gratuitousARP(hostMAC2, hostIP)
	w.send(t, garp[1])
	w.send(t, garp[0])
	w.send(t, arpProbeAnswer(probe, hostMAC, hostIP))
	r := result(t, ch)
	if !r.Reachable || r.Addr != hostIP || r.Interface != "eth0" || r.MAC.String() != hostMAC.String() || r.RTT <= 0 || r.Reason != ProbeAnswered {
		t.Fatalf("result %+v, want %s reachable at %s on eth0", r, hostIP, hostMAC)
	}

	// The MAC is known now: the next call probes unicast.
	ch = probeAsync(n.p, ctx, hostIP)
	probe = w.next(t)
	checkARPProbe(t, probe, hostIP, hostMAC)
	w.send(t, arpProbeAnswer(probe, hostMAC, hostIP))
	if r := result(t, ch); !r.Reachable {
		t.Fatalf("unicast probe answered, result %+v", r)
	}
}

// waitEnd returns the network end of an interface's socket once the
// Prober opened it.
func waitEnd(t *testing.T, n *probeNet, m map[string]*memConn, name string) *memConn {
	t.Helper()
	var c *memConn
	waitFor(t, "probe socket on "+name, func() bool { c = n.end(m, name); return c != nil })
	return c
}

func TestProberNoAnswer(t *testing.T) {
	// Answered calls run with a long interval, so that they never depend
	// on timing; the unanswered one with a short one.
	n := startProbeNet(t, ProberOptions{Interval: 10 * time.Second, Attempts: 4}, probeLink("eth0", 2, eth0MAC))
	ctx := context.Background()
	// Learn the MAC first.
	ch := probeAsync(n.p, ctx, hostIP)
	w := waitEnd(t, n, n.arp, "eth0")
	w.send(t, arpProbeAnswer(w.next(t), hostMAC, hostIP))
	if r := result(t, ch); !r.Reachable {
		t.Fatalf("result %+v", r)
	}
	// The host is gone: Attempts unicast probes, then noAnswer.
	n.p.opts.Interval = 5 * time.Millisecond
	r := n.p.Probe(ctx, hostIP)
	n.p.opts.Interval = 10 * time.Second
	if r.Reachable || r.Reason != ProbeNoAnswer {
		t.Fatalf("result %+v, want not reachable, %s", r, ProbeNoAnswer)
	}
	for range 4 {
		checkARPProbe(t, w.next(t), hostIP, hostMAC)
	}
	if len(w.in) != 0 {
		t.Fatalf("%d probes more than Attempts", len(w.in))
	}
	// An unanswered call forgets the MAC: the next one starts broadcast.
	ch = probeAsync(n.p, ctx, hostIP)
	probe := w.next(t)
	checkARPProbe(t, probe, hostIP, mustMAC("ff:ff:ff:ff:ff:ff"))
	w.send(t, arpProbeAnswer(probe, hostMAC2, hostIP)) // a new NIC
	if r := result(t, ch); !r.Reachable || r.MAC.String() != hostMAC2.String() {
		t.Fatalf("result %+v, want reachable at %s", r, hostMAC2)
	}
}

func TestProberConcurrent(t *testing.T) {
	n := startProbeNet(t, ProberOptions{Interval: 10 * time.Second}, probeLink("eth0", 2, eth0MAC))
	ctx := context.Background()
	ch1 := probeAsync(n.p, ctx, hostIP)
	ch2 := probeAsync(n.p, ctx, hostIP2)
	ch1b := probeAsync(n.p, ctx, hostIP) // a second caller for the same address
	w := waitEnd(t, n, n.arp, "eth0")
	probes := map[netip.Addr][]byte{}
	for len(probes) < 2 {
		b := w.next(t)
		var f arpFrame
		if !parseARP(b, &f) {
			t.Fatalf("not ARP: % x", b)
		}
		probes[v4addr(f.tpa)] = b
	}
	// Answer in reverse order; each call gets its own host's answer.
	w.send(t, arpProbeAnswer(probes[hostIP2], hostMAC2, hostIP2))
	if r := result(t, ch2); !r.Reachable || r.MAC.String() != hostMAC2.String() || r.Addr != hostIP2 {
		t.Fatalf("probe of %s: %+v", hostIP2, r)
	}
	w.send(t, arpProbeAnswer(probes[hostIP], hostMAC, hostIP))
	for _, ch := range []<-chan ProbeResult{ch1, ch1b} {
		if r := result(t, ch); !r.Reachable || r.MAC.String() != hostMAC.String() || r.Addr != hostIP {
			t.Fatalf("probe of %s: %+v", hostIP, r)
		}
	}
	if n.opens != 1 {
		t.Errorf("%d sockets opened, want 1 kept for all calls", n.opens)
	}
}

func TestProberIPv6(t *testing.T) {
	n := startProbeNet(t, ProberOptions{Interval: 10 * time.Second}, probeLink("eth0", 2, eth0MAC))
	ctx := context.Background()
	ll := netip.MustParseAddr(ll0)
	na := func(ethSrc net.HardwareAddr, target netip.Addr, solicited bool, lla net.HardwareAddr) []byte {
		m := &ndp.NeighborAdvertisement{Solicited: solicited, TargetAddress: target}
		if lla != nil {
			m.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: lla}}
		}
		return ipv6Frame(t, ethSrc, mustMAC(eth0MAC), target, ll, m)
	}
	checkNS := func(b []byte, dstMAC net.HardwareAddr, dst netip.Addr) {
		t.Helper()
		if got := net.HardwareAddr(b[6:12]).String(); got != eth0MAC {
			t.Errorf("Ethernet source %s, want %s", got, eth0MAC)
		}
		gotDstMAC, src, gotDst, hop, m := decodeNDP(t, b)
		ns, ok := m.(*ndp.NeighborSolicitation)
		if !ok || ns.TargetAddress != host6 || src != ll || gotDst != dst || gotDstMAC.String() != dstMAC.String() || hop != 255 {
			t.Fatalf("want NS for %s from %s to %s/%s, got %T %+v from %s to %s/%s hop %d", host6, ll, dst, dstMAC, m, m, src, gotDst, gotDstMAC, hop)
		}
		if len(ns.Options) != 1 {
			t.Fatalf("options %v, want our source link-layer address", ns.Options)
		}
		if o, ok := ns.Options[0].(*ndp.LinkLayerAddress); !ok || o.Direction != ndp.Source || o.Addr.String() != eth0MAC {
			t.Fatalf("option %+v, want source link-layer address %s", ns.Options[0], eth0MAC)
		}
	}

	ch := probeAsync(n.p, ctx, host6)
	w := waitEnd(t, n, n.ndp, "eth0")
	g := solicitedNodeGroup(host6)
	mm := multicastMAC(g)
	checkNS(w.next(t), net.HardwareAddr(mm[:]), g)
	w.send(t, na(hostMAC2, vip6, true, hostMAC2))   // another target
	w.send(t, na(hostMAC2, host6, false, hostMAC2)) // unsolicited
	w.send(t, na(hostMAC, host6, true, hostMAC))
	if r := result(t, ch); !r.Reachable || r.MAC.String() != hostMAC.String() || r.Interface != "eth0" {
		t.Fatalf("result %+v, want reachable at %s", r, hostMAC)
	}
	// Known: unicast to the MAC and the address; Linux leaves the option
	// out of answers to unicast solicitations: the Ethernet source counts.
	ch = probeAsync(n.p, ctx, host6)
	checkNS(w.next(t), hostMAC, host6)
	w.send(t, na(hostMAC, host6, true, nil))
	if r := result(t, ch); !r.Reachable || r.MAC.String() != hostMAC.String() {
		t.Fatalf("result %+v, want reachable at %s", r, hostMAC)
	}
	if n.end(n.arp, "eth0") != nil {
		t.Errorf("an ARP socket was opened for IPv6 probes only")
	}
}

func TestProberInterfaces(t *testing.T) {
	second := probeLink("eth1", 3, eth1MAC)
	second.Prefixes = []netip.Prefix{netip.MustParsePrefix("198.51.100.1/24"), netip.MustParsePrefix("192.0.2.2/24")}
	down := probeLink("eth2", 4, "02:00:00:00:00:03")
	down.Up = false
	excluded := probeLink("veth0", 5, "02:00:00:00:00:04")
	n := startProbeNet(t, ProberOptions{Interval: time.Millisecond, Attempts: 1, LinksMaxAge: time.Nanosecond},
		probeLink("eth0", 2, eth0MAC), second, down, excluded)
	ctx := context.Background()
	for _, tc := range []struct {
		addr   netip.Addr
		reason ProbeReason
	}{
		{netip.MustParseAddr("203.0.113.9"), ProbeNoInterface},
		{netip.MustParseAddr("192.0.2.2"), ProbeNoInterface}, // our own address
		{netip.MustParseAddr("2001:db8:1::9"), ProbeNoInterface},
		{hostIP, ProbeNoAnswer},
	} {
		if r := n.p.Probe(ctx, tc.addr); r.Reachable || r.Reason != tc.reason {
			t.Errorf("Probe(%s) = %+v, want reason %s", tc.addr, r, tc.reason)
		}
	}
	// hostIP is on-link on eth0 and on eth1 (its second prefix): probed on
	// both, on no other.
	for _, name := range []string{"eth0", "eth1"} {
		if c := n.end(n.arp, name); c == nil || len(c.in) != 1 {
			t.Errorf("%s: want one probe", name)
		}
	}
	for _, name := range []string{"eth2", "veth0"} {
		if n.end(n.arp, name) != nil {
			t.Errorf("%s probed", name)
		}
	}
	// eth1 goes away: its socket is closed at the next listing.
	old := n.end(n.arp, "eth1")
	n.mu.Lock()
	n.links = n.links[:1]
	n.mu.Unlock()
	n.p.Probe(ctx, hostIP)
	select {
	case <-old.peer.closed:
	default:
		t.Errorf("socket of a removed interface still open")
	}
}

// failConn fails every write.
type failConn struct{ *memConn }

func (*failConn) WriteTo([]byte, net.Addr) (int, error) { return 0, errors.New("network is down") }

func TestProberFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("send failed", func(t *testing.T) {
		n := startProbeNet(t, ProberOptions{Interval: time.Millisecond}, probeLink("eth0", 2, eth0MAC))
		n.p.opts.ListenARP = func(Link) (net.PacketConn, error) {
			c, _ := memPipe()
			return &failConn{memConn: c}, nil
		}
		r := n.p.Probe(ctx, hostIP)
		if r.Reachable || r.Reason != ProbeSendFailed || !strings.Contains(r.Why(), "network is down") || !strings.Contains(r.Why(), "eth0") {
			t.Fatalf("result %+v, want sendFailed naming the interface and the error", r)
		}
	})
	t.Run("socket cannot be opened", func(t *testing.T) {
		n := startProbeNet(t, ProberOptions{Interval: time.Millisecond}, probeLink("eth0", 2, eth0MAC))
		n.p.opts.ListenARP = func(Link) (net.PacketConn, error) { return nil, errors.New("operation not permitted") }
		if r := n.p.Probe(ctx, hostIP); r.Reachable || r.Reason != ProbeSendFailed || !strings.Contains(r.Why(), "not permitted") {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		n := startProbeNet(t, ProberOptions{Interval: time.Hour}, probeLink("eth0", 2, eth0MAC))
		cctx, cancel := context.WithCancel(ctx)
		ch := probeAsync(n.p, cctx, hostIP)
		waitEnd(t, n, n.arp, "eth0").next(t)
		cancel()
		if r := result(t, ch); r.Reachable || r.Reason != ProbeCanceled {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("closed", func(t *testing.T) {
		n := startProbeNet(t, ProberOptions{Interval: time.Millisecond}, probeLink("eth0", 2, eth0MAC))
		n.p.Probe(ctx, hostIP)
		c := n.end(n.arp, "eth0")
		if err := n.p.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.peer.closed:
		default:
			t.Errorf("socket still open after Close")
		}
		if r := n.p.Probe(ctx, hostIP); r.Reason != ProbeClosed {
			t.Fatalf("result %+v after Close", r)
		}
	})
}

// TestProberSurvey: a survey probes broadcast even when a MAC is known for
// the address, and reports every host that answers, once each.
func TestProberSurvey(t *testing.T) {
	n := startProbeNet(t, ProberOptions{Interval: 20 * time.Millisecond, Attempts: 2}, probeLink("eth0", 2, eth0MAC))
	ctx := context.Background()
	// Learn hostIP's MAC, as the health loop's probes would.
	ch := probeAsync(n.p, ctx, hostIP)
	w := waitEnd(t, n, n.arp, "eth0")
	w.send(t, arpProbeAnswer(w.next(t), hostMAC, hostIP))
	if r := result(t, ch); !r.Reachable {
		t.Fatalf("result %+v", r)
	}
	type survey struct {
		answers []SurveyAnswer
		reason  ProbeReason
	}
	done := make(chan survey, 1)
	go func() {
		a, r, _ := n.p.Survey(ctx, hostIP, 200*time.Millisecond)
		done <- survey{a, r}
	}()
	probe := w.next(t)
	checkARPProbe(t, probe, hostIP, mustMAC("ff:ff:ff:ff:ff:ff"))
	// Two hosts answer, one of them twice; another address's answer does
	// not count.
	w.send(t, arpProbeAnswer(probe, hostMAC, hostIP))
	w.send(t, arpProbeAnswer(probe, hostMAC2, hostIP))
	w.send(t, arpProbeAnswer(probe, hostMAC2, hostIP))
	w.send(t, arpProbeAnswer(probe, hostMAC2, hostIP2))
	checkARPProbe(t, w.next(t), hostIP, mustMAC("ff:ff:ff:ff:ff:ff"))
	var got survey
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Survey did not return")
	}
	var macs []string
	for _, a := range got.answers {
		if a.Interface != "eth0" {
			t.Errorf("answer on %q, want eth0", a.Interface)
		}
		macs = append(macs, a.MAC.String())
	}
	slices.Sort(macs)
	if want := []string{hostMAC.String(), hostMAC2.String()}; got.reason != ProbeAnswered || !slices.Equal(macs, want) {
		t.Fatalf("survey: %v %s, want %v answered", macs, got.reason, want)
	}
	if _, r, _ := n.p.Survey(ctx, netip.MustParseAddr("203.0.113.9"), time.Millisecond); r != ProbeNoInterface {
		t.Errorf("survey of an off-link address: %s, want %s", r, ProbeNoInterface)
	}
}
