package layer2

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
)

// memConn is one end of an in-memory Ethernet segment: frames written to one
// end are read from the other. The announcer gets one end through the
// ListenARP/ListenNDP seams; the test plays the network on the other.
type memConn struct {
	in     chan []byte
	peer   *memConn
	closed chan struct{}
	once   sync.Once
}

func memPipe() (*memConn, *memConn) {
	a := &memConn{in: make(chan []byte, 4096), closed: make(chan struct{})}
	b := &memConn{in: make(chan []byte, 4096), closed: make(chan struct{})}
	a.peer, b.peer = b, a
	return a, b
}

func (c *memConn) ReadFrom(b []byte) (int, net.Addr, error) {
	select {
	case f := <-c.in:
		return copy(b, f), nil, nil
	case <-c.closed:
		return 0, nil, net.ErrClosed
	}
}

func (c *memConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	f := slices.Clone(b)
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case c.peer.in <- f:
		return len(b), nil
	}
}

func (c *memConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *memConn) LocalAddr() net.Addr              { return nil }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// send injects a frame as if it arrived on the wire.
func (c *memConn) send(t *testing.T, f []byte) {
	t.Helper()
	if _, err := c.WriteTo(f, nil); err != nil {
		t.Fatalf("injecting frame: %v", err)
	}
}

// next returns the next frame the responder sent, failing after a generous
// deadline (a missing frame is a failure, not a timing measurement).
func (c *memConn) next(t *testing.T) []byte {
	t.Helper()
	select {
	case f := <-c.in:
		return f
	case <-time.After(10 * time.Second):
		t.Fatalf("no frame sent by the responder within 10s")
		return nil
	}
}

// groupRecorder records multicast joins and leaves.
type groupRecorder struct {
	mu     sync.Mutex
	joined map[netip.Addr]int
	log    []string
}

func (g *groupRecorder) JoinGroup(a netip.Addr) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.joined[a]++
	g.log = append(g.log, "join "+a.String())
	return nil
}

func (g *groupRecorder) LeaveGroup(a netip.Addr) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.joined[a]--
	if g.joined[a] == 0 {
		delete(g.joined, a)
	}
	g.log = append(g.log, "leave "+a.String())
	return nil
}

func (g *groupRecorder) Close() error { return nil }

func (g *groupRecorder) isJoined(a netip.Addr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.joined[a] > 0
}

// testNet runs an Announcer over in-memory links.
type testNet struct {
	a      *Announcer
	reg    *prometheus.Registry
	mu     sync.Mutex
	links  []Link
	arp    map[string]*memConn // network ends by interface
	ndp    map[string]*memConn
	groups map[string]*groupRecorder
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func testLink(name string, idx int, mac string, ll string) Link {
	l := Link{Name: name, Index: idx, MAC: mustMAC(mac), Up: true, Broadcast: true}
	if ll != "" {
		l.LinkLocal = netip.MustParseAddr(ll)
	}
	return l
}

func startTestNet(t *testing.T, opts Options, links ...Link) *testNet {
	t.Helper()
	n := &testNet{
		reg: prometheus.NewRegistry(), links: links,
		arp: map[string]*memConn{}, ndp: map[string]*memConn{}, groups: map[string]*groupRecorder{},
	}
	opts.Registerer = n.reg
	opts.Links = func() ([]Link, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return slices.Clone(n.links), nil
	}
	opts.ListenARP = func(l Link) (net.PacketConn, error) {
		ours, theirs := memPipe()
		n.mu.Lock()
		n.arp[l.Name] = theirs
		n.mu.Unlock()
		return ours, nil
	}
	opts.ListenNDP = func(l Link) (net.PacketConn, MulticastGroups, error) {
		ours, theirs := memPipe()
		g := &groupRecorder{joined: map[netip.Addr]int{}}
		n.mu.Lock()
		n.ndp[l.Name] = theirs
		n.groups[l.Name] = g
		n.mu.Unlock()
		return ours, g, nil
	}
	n.a = NewAnnouncer(testr.New(t), opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	want := []string{}
	for _, l := range links {
		if a, nd, _ := eligibility(l, n.a.opts.ExcludeInterfaces); a || nd {
			want = append(want, l.Name)
		}
	}
	slices.Sort(want)
	waitFor(t, "responders on the test links", func() bool { return slices.Equal(n.a.Interfaces(), want) })
	return n
}

func (n *testNet) arpEnd(name string) *memConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.arp[name]
}

func (n *testNet) ndpEnd(name string) *memConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ndp[name]
}

// waitFor polls cond with a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var (
	clientMAC = mustMAC("02:00:00:00:00:c1")
	otherMAC  = mustMAC("02:00:00:00:00:99")
	clientIP  = netip.MustParseAddr("192.0.2.1")
)

// arpRequest builds a request from the client for target, to ethDst.
func arpRequest(t *testing.T, target netip.Addr, ethDst net.HardwareAddr) []byte {
	t.Helper()
	b, err := arpFrameBytes(arp.OperationRequest, clientMAC, clientIP, make(net.HardwareAddr, 6), target, ethDst)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// parseARPWithLib decodes a frame with mdlayher/ethernet and mdlayher/arp, an
// independent parser to check ours against.
func parseARPWithLib(t *testing.T, b []byte) (*ethernet.Frame, *arp.Packet) {
	t.Helper()
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil {
		t.Fatalf("ethernet frame: %v", err)
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f.Payload); err != nil {
		t.Fatalf("arp packet: %v", err)
	}
	return &f, &p
}

// ipv6Frame wraps an NDP message in IPv6 (hop limit 255) and Ethernet.
func ipv6Frame(t testing.TB, srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, m ndp.Message) []byte {
	t.Helper()
	body, err := ndp.MarshalMessageChecksum(m, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 14+40+len(body))
	copy(b[0:6], dstMAC)
	copy(b[6:12], srcMAC)
	binary.BigEndian.PutUint16(b[12:14], etherTypeIPv6)
	b[14] = 0x60
	binary.BigEndian.PutUint16(b[18:20], uint16(len(body)))
	b[20], b[21] = protoICMPv6, 255
	s, d := src.As16(), dst.As16()
	copy(b[22:38], s[:])
	copy(b[38:54], d[:])
	copy(b[54:], body)
	return b
}

// decodeNDP splits a frame the responder sent into Ethernet/IPv6 fields and
// the NDP message parsed by mdlayher/ndp, checking the ICMPv6 checksum.
func decodeNDP(t *testing.T, b []byte) (dstMAC net.HardwareAddr, src, dst netip.Addr, hop uint8, m ndp.Message) {
	t.Helper()
	if len(b) < 54 || binary.BigEndian.Uint16(b[12:14]) != etherTypeIPv6 || b[20] != protoICMPv6 {
		t.Fatalf("not an ICMPv6 frame: % x", b)
	}
	src = netip.AddrFrom16([16]byte(b[22:38]))
	dst = netip.AddrFrom16([16]byte(b[38:54]))
	body := b[54:]
	m, err := ndp.ParseMessage(body)
	if err != nil {
		t.Fatalf("parsing NDP message: %v", err)
	}
	want, err := ndp.MarshalMessageChecksum(m, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(want[2:4], body[2:4]) {
		t.Fatalf("ICMPv6 checksum %x, want %x", body[2:4], want[2:4])
	}
	return net.HardwareAddr(b[0:6]), src, dst, b[21], m
}

// SetBalancer sets the IPs balancer name owns on this node and the interfaces
// to answer on (empty: all eligible): Apply with one update.
func (a *Announcer) SetBalancer(name string, ips []netip.Addr, interfaces []string) {
	a.Apply([]BalancerUpdate{{Name: name, IPs: ips, Interfaces: interfaces}})
}

// DeleteBalancer forgets balancer name: Apply with one removal.
func (a *Announcer) DeleteBalancer(name string) {
	a.Apply([]BalancerUpdate{{Name: name, Delete: true}})
}
