package layer2

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

var (
	synSrc4  = netip.MustParsePrefix("192.0.2.5/24")
	synSrc6  = netip.MustParsePrefix("2001:db8::5/64")
	synVIP4  = netip.AddrPortFrom(vip1, 80)
	synVIP6  = netip.AddrPortFrom(vip6, 443)
	synOwner = hostMAC
)

// refChecksumOK is an independent RFC 1071 check, written differently from
// sumBytes/checksum (16-bit adds with the end-around carry at each step):
// the ones' complement sum of a pseudo-header and a segment that includes
// its checksum field is 0xffff.
func refChecksumOK(parts ...[]byte) bool {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	var s uint16
	for i := 0; i < len(b); i += 2 {
		w := uint16(b[i]) << 8
		if i+1 < len(b) {
			w |= uint16(b[i+1])
		}
		t := uint32(s) + uint32(w)
		s = uint16(t) + uint16(t>>16)
	}
	return s == 0xffff
}

// pseudoHeader builds the TCP pseudo-header by hand (RFC 793 for IPv4,
// RFC 8200 8.1 for IPv6).
func pseudoHeader(src, dst netip.Addr, tcpLen int) []byte {
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		return append(append(s[:], d[:]...), 0, protoTCP, byte(tcpLen>>8), byte(tcpLen))
	}
	s, d := src.As16(), dst.As16()
	return append(append(s[:], d[:]...), 0, 0, byte(tcpLen>>8), byte(tcpLen), 0, 0, 0, protoTCP)
}

// checkTCPFrame decodes a frame writeTCP wrote with x/net's IP header
// parsers and by hand, verifies both checksums independently and returns
// the TCP segment (header and options).
func checkTCPFrame(t testing.TB, b []byte, want *tcpSegment) []byte {
	t.Helper()
	if len(b) < minFrameLen {
		t.Fatalf("frame of %d bytes, shorter than the Ethernet minimum", len(b))
	}
	if [6]byte(b[0:6]) != want.ethDst || [6]byte(b[6:12]) != want.ethSrc {
		t.Fatalf("Ethernet %s -> %s, want %s -> %s", net.HardwareAddr(b[6:12]), net.HardwareAddr(b[0:6]),
			net.HardwareAddr(want.ethSrc[:]), net.HardwareAddr(want.ethDst[:]))
	}
	var tcp []byte
	if want.src.Addr().Is4() {
		if et := binary.BigEndian.Uint16(b[12:14]); et != 0x0800 {
			t.Fatalf("EtherType %#04x", et)
		}
		h, err := ipv4.ParseHeader(b[14:])
		if err != nil {
			t.Fatal(err)
		}
		if h.Version != 4 || h.Len != 20 || h.TTL != 64 || h.Protocol != 6 || h.Flags != ipv4.DontFragment || h.FragOff != 0 ||
			h.ID != int(want.ipID) || !h.Src.Equal(want.src.Addr().AsSlice()) || !h.Dst.Equal(want.dst.Addr().AsSlice()) {
			t.Fatalf("IPv4 header %+v", h)
		}
		if !refChecksumOK(b[14:34]) {
			t.Fatalf("IPv4 header checksum %#04x does not verify", h.Checksum)
		}
		tcp = b[34 : 14+h.TotalLen]
	} else {
		if et := binary.BigEndian.Uint16(b[12:14]); et != 0x86dd {
			t.Fatalf("EtherType %#04x", et)
		}
		h, err := ipv6.ParseHeader(b[14:])
		if err != nil {
			t.Fatal(err)
		}
		if h.Version != 6 || h.HopLimit != 64 || h.NextHeader != 6 || h.TrafficClass != 0 || h.FlowLabel != 0 ||
			!h.Src.Equal(want.src.Addr().AsSlice()) || !h.Dst.Equal(want.dst.Addr().AsSlice()) || 54+h.PayloadLen != len(b) {
			t.Fatalf("IPv6 header %+v, frame of %d bytes", h, len(b))
		}
		tcp = b[54:]
	}
	if !refChecksumOK(pseudoHeader(want.src.Addr(), want.dst.Addr(), len(tcp)), tcp) {
		t.Fatalf("TCP checksum %#04x does not verify", binary.BigEndian.Uint16(tcp[16:18]))
	}
	wantLen := 20
	if want.mss != 0 {
		wantLen = 24
	}
	if len(tcp) != wantLen || int(tcp[12]>>4)*4 != wantLen {
		t.Fatalf("TCP segment of %d bytes, data offset %d, want %d", len(tcp), tcp[12]>>4, wantLen)
	}
	if binary.BigEndian.Uint16(tcp[0:2]) != want.src.Port() || binary.BigEndian.Uint16(tcp[2:4]) != want.dst.Port() ||
		binary.BigEndian.Uint32(tcp[4:8]) != want.seq || binary.BigEndian.Uint32(tcp[8:12]) != want.ack ||
		tcp[13] != want.flags || binary.BigEndian.Uint16(tcp[14:16]) != want.window || binary.BigEndian.Uint16(tcp[18:20]) != 0 {
		t.Fatalf("TCP header % x, want %+v", tcp[:20], want)
	}
	if want.mss != 0 && (tcp[20] != 2 || tcp[21] != 4 || binary.BigEndian.Uint16(tcp[22:24]) != want.mss) {
		t.Fatalf("MSS option % x, want %d", tcp[20:24], want.mss)
	}
	// Parsed back, the frame gives the same fields.
	var r synReply
	if !parseSYNReply(b, &r) || r.src != want.src || r.dst != want.dst || r.seq != want.seq || r.ack != want.ack || r.flags != want.flags {
		t.Fatalf("parsed back as %+v", r)
	}
	return tcp
}

func TestChecksumRFC1071Example(t *testing.T) {
	// RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	if got := checksum(sumBytes(0, b)); got != ^uint16(0xddf2) {
		t.Fatalf("checksum %#04x, want %#04x", got, ^uint16(0xddf2))
	}
	// Odd length: the last byte is padded with zero.
	if got, want := checksum(sumBytes(0, []byte{0x01, 0x02, 0x03})), ^uint16(0x0102+0x0300); got != want {
		t.Fatalf("odd-length checksum %#04x, want %#04x", got, want)
	}
}

func TestWriteTCPFrames(t *testing.T) {
	src4, src6 := netip.AddrPortFrom(synSrc4.Addr(), 61234), netip.AddrPortFrom(synSrc6.Addr(), 65535)
	for _, tc := range []struct {
		name string
		seg  tcpSegment
	}{
		{"IPv4 SYN", tcpSegment{src: src4, dst: synVIP4, seq: 0xdeadbeef, flags: tcpSYN, window: synWindow, mss: synMSS(synVIP4.Addr()), ipID: 0xabcd}},
		{"IPv4 RST", tcpSegment{src: src4, dst: synVIP4, seq: 0xdeadbef0, flags: tcpRST, ipID: 1}},
		{"IPv4 SYN-ACK", tcpSegment{src: synVIP4, dst: src4, seq: 0xffffffff, ack: 0xdeadbef0, flags: tcpSYN | tcpACK, window: 65535, mss: 1460}},
		{"IPv6 SYN", tcpSegment{src: src6, dst: synVIP6, seq: 7, flags: tcpSYN, window: synWindow, mss: synMSS(synVIP6.Addr())}},
		{"IPv6 RST", tcpSegment{src: src6, dst: synVIP6, seq: 8, flags: tcpRST}},
		{"IPv6 RST-ACK", tcpSegment{src: synVIP6, dst: src6, ack: 8, flags: tcpRST | tcpACK}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.seg.ethDst, tc.seg.ethSrc = [6]byte(synOwner), [6]byte(mustMAC(eth0MAC))
			var buf [tcpFrameMax]byte
			for i := range buf {
				buf[i] = 0xa5 // stale bytes must not leak into the frame
			}
			b := writeTCP(buf[:], &tc.seg)
			checkTCPFrame(t, b, &tc.seg)
			if tc.seg.src.Addr().Is4() && len(b) == minFrameLen {
				ipEnd := 14 + int(binary.BigEndian.Uint16(b[16:18]))
				if slices.ContainsFunc(b[ipEnd:], func(x byte) bool { return x != 0 }) {
					t.Fatalf("padding not zero: % x", b[ipEnd:])
				}
			}
		})
	}
	if got := testing.AllocsPerRun(100, func() {
		var buf [tcpFrameMax]byte
		writeTCP(buf[:], &tcpSegment{src: src6, dst: synVIP6, flags: tcpSYN, mss: 1440})
	}); got != 0 {
		t.Errorf("writeTCP allocates %v times", got)
	}
}

// synReplyFrame is the owner's answer to the SYN frame syn: flags with the
// acknowledgement ack (ISN+1 for a genuine answer), from VIP:port to the
// probe's address and port.
func synReplyFrame(t testing.TB, syn []byte, flags uint8, ack uint32) []byte {
	t.Helper()
	var r synReply
	if !parseSYNReply(syn, &r) {
		t.Fatalf("not a TCP frame: % x", syn)
	}
	var buf [tcpFrameMax]byte
	return slices.Clone(writeTCP(buf[:], &tcpSegment{
		ethDst: [6]byte(syn[6:12]), ethSrc: [6]byte(syn[0:6]), src: r.dst, dst: r.src,
		seq: 0x1000, ack: ack, flags: flags, window: 65535,
	}))
}

func TestParseSYNReply(t *testing.T) {
	var buf [tcpFrameMax]byte
	base := slices.Clone(writeTCP(buf[:], &tcpSegment{src: synVIP4, dst: netip.AddrPortFrom(synSrc4.Addr(), 61000), seq: 1, ack: 2, flags: tcpSYN | tcpACK}))
	base6 := slices.Clone(writeTCP(buf[:], &tcpSegment{src: synVIP6, dst: netip.AddrPortFrom(synSrc6.Addr(), 61000), seq: 1, ack: 2, flags: tcpRST | tcpACK}))
	edit := func(b []byte, f func([]byte)) []byte {
		b = slices.Clone(b)
		f(b)
		return b
	}
	// IPv4 with a 4-byte option (NOP padding): TCP starts at 14+24.
	withOpt := slices.Concat(base[:34], []byte{1, 1, 1, 1}, base[34:54])
	withOpt[14] = 0x46
	binary.BigEndian.PutUint16(withOpt[16:18], 20+4+20)
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"IPv4 SYN-ACK", base, true},
		{"IPv6 RST-ACK", base6, true},
		{"IPv4 with options", withOpt, true},
		{"empty", nil, false},
		{"Ethernet header only", base[:14], false},
		{"IPv4 header cut", base[:33], false},
		{"TCP header cut", base[:53], false},
		{"IPv6 TCP header cut", base6[:73], false},
		{"ARP", edit(base, func(b []byte) { b[12], b[13] = 0x08, 0x06 }), false},
		{"VLAN tag", edit(base, func(b []byte) { b[12], b[13] = 0x81, 0x00 }), false},
		{"IPv4 version 6", edit(base, func(b []byte) { b[14] = 0x65 }), false},
		{"IPv4 header length 16", edit(base, func(b []byte) { b[14] = 0x44 }), false},
		{"IPv4 header longer than the frame", edit(base, func(b []byte) { b[14] = 0x4f }), false},
		{"IPv4 total length too short for TCP", edit(base, func(b []byte) { b[17] = 39 }), false},
		{"UDP", edit(base, func(b []byte) { b[23] = 17 }), false},
		{"first fragment", edit(base, func(b []byte) { b[20] |= 0x20 }), false},
		{"later fragment", edit(base, func(b []byte) { b[21] = 1 }), false},
		{"TCP data offset 4", edit(base, func(b []byte) { b[46] = 0x40 }), false},
		{"IPv6 hop-by-hop header", edit(base6, func(b []byte) { b[20] = 0 }), false},
		{"IPv6 payload length 19", edit(base6, func(b []byte) { b[18], b[19] = 0, 19 }), false},
		{"IPv6 version 4", edit(base6, func(b []byte) { b[14] = 0x40 }), false},
	} {
		var r synReply
		if got := parseSYNReply(tc.b, &r); got != tc.want {
			t.Errorf("%s: parsed %v, want %v", tc.name, got, tc.want)
		}
		if tc.name == "IPv4 with options" && (r.src != synVIP4 || r.dst.Port() != 61000 || r.flags != tcpSYN|tcpACK || r.ack != 2) {
			t.Errorf("IPv4 with options parsed as %+v", r)
		}
	}
}

// TestSYNReplyFilter runs the socket filters in x/net/bpf's interpreter.
func TestSYNReplyFilter(t *testing.T) {
	src4, src6 := synSrc4.Addr(), synSrc6.Addr()
	var buf [tcpFrameMax]byte
	mk := func(src, dst netip.AddrPort, flags uint8) []byte {
		return slices.Clone(writeTCP(buf[:], &tcpSegment{src: src, dst: dst, ack: 1, flags: flags}))
	}
	to4, to6 := netip.AddrPortFrom(src4, 61000), netip.AddrPortFrom(src6, 65535)
	synAck4 := mk(synVIP4, to4, tcpSYN|tcpACK)
	withOpt := slices.Concat(synAck4[:34], []byte{1, 1, 1, 1}, synAck4[34:54])
	withOpt[14] = 0x46
	frag := slices.Clone(synAck4)
	frag[20] |= 0x20
	for _, tc := range []struct {
		name  string
		src   netip.Addr
		frame []byte
		want  bool
	}{
		{"IPv4 SYN-ACK", src4, synAck4, true},
		{"IPv4 SYN-ACK after IP options", src4, withOpt, true},
		{"IPv4 RST-ACK", src4, mk(synVIP4, to4, tcpRST|tcpACK), true},
		{"IPv4 bare RST", src4, mk(synVIP4, to4, tcpRST), true},
		{"IPv4 ACK", src4, mk(synVIP4, to4, tcpACK), false},
		{"IPv4 SYN", src4, mk(synVIP4, to4, tcpSYN), false},
		{"IPv4 SYN-ACK to another address", src4, mk(synVIP4, netip.AddrPortFrom(vip2, 61000), tcpSYN|tcpACK), false},
		{"IPv4 SYN-ACK below the probe ports", src4, mk(synVIP4, netip.AddrPortFrom(src4, 60999), tcpSYN|tcpACK), false},
		{"IPv4 fragment", src4, frag, false},
		{"IPv6 frame on the IPv4 filter", src4, mk(synVIP6, to6, tcpSYN|tcpACK), false},
		{"IPv6 SYN-ACK", src6, mk(synVIP6, to6, tcpSYN|tcpACK), true},
		{"IPv6 RST-ACK", src6, mk(synVIP6, to6, tcpRST|tcpACK), true},
		{"IPv6 FIN-ACK", src6, mk(synVIP6, to6, tcpACK|0x01), false},
		{"IPv6 SYN-ACK to another address", src6, mk(synVIP6, netip.AddrPortFrom(client6, 65535), tcpSYN|tcpACK), false},
		{"IPv6 SYN-ACK below the probe ports", src6, mk(synVIP6, netip.AddrPortFrom(src6, 443), tcpSYN|tcpACK), false},
		{"IPv4 frame on the IPv6 filter", src6, synAck4, false},
	} {
		raw, err := synReplyFilter(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		insns, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatal("cannot disassemble")
		}
		vm, err := bpf.NewVM(withoutExtensions(insns))
		if err != nil {
			t.Fatal(err)
		}
		n, err := vm.Run(tc.frame)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if (n > 0) != tc.want {
			t.Errorf("%s: accepted %d bytes, want accepted=%v", tc.name, n, tc.want)
		}
		if n > 0 && n < len(tc.frame) {
			t.Errorf("%s: keeps %d of %d bytes", tc.name, n, len(tc.frame))
		}
	}
}

func TestSourceFor(t *testing.T) {
	pfx := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.5/24"), netip.MustParsePrefix("192.0.2.5/24"),
		netip.MustParsePrefix("2001:db8:1::5/64"), netip.MustParsePrefix("2001:db8::5/64"),
	}
	for _, tc := range []struct{ vip, want string }{
		{"192.0.2.10", "192.0.2.5"},        // the on-link one
		{"198.51.100.1", "10.0.0.5"},       // none on-link: the first of the family
		{"2001:db8::10", "2001:db8::5"},    // on-link, though not first
		{"2001:db8:9::1", "2001:db8:1::5"}, // the first IPv6 one
	} {
		if got := sourceFor(pfx, netip.MustParseAddr(tc.vip)); got.String() != tc.want {
			t.Errorf("source for %s: %s, want %s", tc.vip, got, tc.want)
		}
	}
	if got := sourceFor(pfx[:2], netip.MustParseAddr("2001:db8::10")); got.IsValid() {
		t.Errorf("IPv6 source from IPv4-only prefixes: %s", got)
	}
}

func TestSYNOutcomeString(t *testing.T) {
	want := []string{"answered", "refused", "timeout", "noInterface", "error", "canceled"}
	for i, w := range want {
		if got := SYNOutcome(i).String(); got != w {
			t.Errorf("SYNOutcome(%d) = %q, want %q", i, got, w)
		}
	}
	if got := SYNOutcome(99).String(); got != "SYNOutcome(99)" {
		t.Errorf("out of range: %q", got)
	}
	r := SYNProbeResult{Outcome: SYNError, Err: errors.New("boom")}
	if r.Why() != "error: boom" || (SYNProbeResult{Outcome: SYNTimeout}).Why() != "timeout" {
		t.Errorf("Why: %q", r.Why())
	}
}

// synFake runs a SYNProber over in-memory links; the test plays the owner
// on the network end of each socket.
type synFake struct {
	p      *SYNProber
	mu     sync.Mutex
	link   Link
	opened []netip.Addr              // sources of the sockets opened, in order
	ends   map[netip.Addr][]*memConn // network ends by source address, latest last
}

func newSYNFake(t *testing.T) *synFake {
	t.Helper()
	f := &synFake{ends: map[netip.Addr][]*memConn{}}
	f.link = testLink("eth0", 2, eth0MAC, "")
	f.link.Prefixes = []netip.Prefix{synSrc4, synSrc6}
	f.p = NewSYNProber(testr.New(t), SYNProberOptions{
		LinkMaxAge: time.Nanosecond, // every probe sees the current link
		lookup: func(name string) (Link, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if name != f.link.Name {
				return Link{}, errNoInterface
			}
			return f.link, nil
		},
		listen: func(l Link, src netip.Addr) (net.PacketConn, error) {
			ours, theirs := memPipe()
			f.mu.Lock()
			defer f.mu.Unlock()
			f.opened = append(f.opened, src)
			f.ends[src] = append(f.ends[src], theirs)
			return ours, nil
		},
	})
	t.Cleanup(func() { _ = f.p.Close() })
	return f
}

// end returns the network end of the latest socket for src.
func (f *synFake) end(t *testing.T, src netip.Addr) *memConn { return f.nthEnd(t, src, 1) }

// nthEnd returns the network end of the nth socket opened for src (1: the
// first), waiting for it to be opened.
func (f *synFake) nthEnd(t *testing.T, src netip.Addr, nth int) *memConn {
	t.Helper()
	var c *memConn
	waitFor(t, "a socket for "+src.String(), func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if e := f.ends[src]; len(e) >= nth {
			c = e[nth-1]
		}
		return c != nil
	})
	return c
}

func (f *synFake) probe(vip netip.AddrPort, timeout time.Duration) <-chan SYNProbeResult {
	ch := make(chan SYNProbeResult, 1)
	go func() {
		ch <- f.p.Probe(context.Background(), SYNProbe{Interface: "eth0", OwnerMAC: synOwner, VIP: vip, Timeout: timeout})
	}()
	return ch
}

func synResult(t *testing.T, ch <-chan SYNProbeResult) SYNProbeResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Probe did not return within 10s")
		return SYNProbeResult{}
	}
}

func noFrame(t *testing.T, c *memConn) {
	t.Helper()
	select {
	case f := <-c.in:
		t.Fatalf("unexpected frame % x", f)
	case <-time.After(20 * time.Millisecond):
	}
}

func TestSYNProbeAnsweredSendsRST(t *testing.T) {
	for _, vip := range []netip.AddrPort{synVIP4, synVIP6} {
		t.Run(vip.String(), func(t *testing.T) {
			f := newSYNFake(t)
			src := synSrc4.Addr()
			if vip.Addr().Is6() {
				src = synSrc6.Addr()
			}
			ch := f.probe(vip, 10*time.Second)
			end := f.end(t, src)
			syn := end.next(t)
			var s synReply
			if !parseSYNReply(syn, &s) {
				t.Fatalf("SYN does not parse: % x", syn)
			}
			if s.src.Port() < synPortMin {
				t.Fatalf("source port %d below %d", s.src.Port(), synPortMin)
			}
			checkTCPFrame(t, syn, &tcpSegment{
				ethDst: [6]byte(synOwner), ethSrc: [6]byte(f.link.MAC), src: netip.AddrPortFrom(src, s.src.Port()), dst: vip,
				seq: s.seq, flags: tcpSYN, window: synWindow, mss: synMSS(vip.Addr()), ipID: binary.BigEndian.Uint16(syn[18:20]),
			})
			end.send(t, synReplyFrame(t, syn, tcpSYN|tcpACK, s.seq+1))
			rst := end.next(t)
			checkTCPFrame(t, rst, &tcpSegment{
				ethDst: [6]byte(synOwner), ethSrc: [6]byte(f.link.MAC), src: s.src, dst: vip,
				seq: s.seq + 1, flags: tcpRST, ipID: binary.BigEndian.Uint16(rst[18:20]),
			})
			r := synResult(t, ch)
			if r.Outcome != SYNAnswered || r.Err != nil || r.Src != s.src || r.RTT <= 0 {
				t.Fatalf("result %+v, want answered from %s", r, s.src)
			}
			// A retransmitted SYN-ACK after Probe returned: not ours any more,
			// no RST (this node's kernel answers it).
			end.send(t, synReplyFrame(t, syn, tcpSYN|tcpACK, s.seq+1))
			noFrame(t, end)
		})
	}
}

func TestSYNProbeRefused(t *testing.T) {
	f := newSYNFake(t)
	ch := f.probe(synVIP6, 10*time.Second)
	end := f.end(t, synSrc6.Addr())
	syn := end.next(t)
	var s synReply
	parseSYNReply(syn, &s)
	end.send(t, synReplyFrame(t, syn, tcpRST|tcpACK, s.seq+1))
	if r := synResult(t, ch); r.Outcome != SYNRefused {
		t.Fatalf("result %+v, want refused", r)
	}
	noFrame(t, end) // no RST answers an RST
}

// TestSYNProbeIgnoresForeignSegments: only a segment from the VIP's address
// and port, to the probe's address and port, with ACK and the right
// acknowledgement, and SYN or RST, answers a probe.
func TestSYNProbeIgnoresForeignSegments(t *testing.T) {
	f := newSYNFake(t)
	ch := f.probe(synVIP4, 10*time.Second)
	end := f.end(t, synSrc4.Addr())
	syn := end.next(t)
	var s synReply
	parseSYNReply(syn, &s)
	good := synReplyFrame(t, syn, tcpSYN|tcpACK, s.seq+1)
	mutate := func(fn func(r *tcpSegment)) []byte {
		var r synReply
		parseSYNReply(good, &r)
		seg := tcpSegment{ethDst: [6]byte(good[0:6]), ethSrc: [6]byte(good[6:12]), src: r.src, dst: r.dst, seq: r.seq, ack: r.ack, flags: r.flags}
		fn(&seg)
		var buf [tcpFrameMax]byte
		return slices.Clone(writeTCP(buf[:], &seg))
	}
	for name, b := range map[string][]byte{
		"stale acknowledgement": mutate(func(r *tcpSegment) { r.ack = s.seq }),
		"no ACK flag":           mutate(func(r *tcpSegment) { r.flags = tcpSYN }),
		"bare ACK":              mutate(func(r *tcpSegment) { r.flags = tcpACK }),
		"other VIP port":        mutate(func(r *tcpSegment) { r.src = netip.AddrPortFrom(r.src.Addr(), 81) }),
		"other VIP":             mutate(func(r *tcpSegment) { r.src = netip.AddrPortFrom(vip2, 80) }),
		"other local port":      mutate(func(r *tcpSegment) { r.dst = netip.AddrPortFrom(r.dst.Addr(), r.dst.Port()^1) }),
		"other local address":   mutate(func(r *tcpSegment) { r.dst = netip.AddrPortFrom(clientIP, r.dst.Port()) }),
		"truncated":             good[:50],
	} {
		end.send(t, b)
		select {
		case r := <-ch:
			t.Fatalf("%s answered the probe: %+v", name, r)
		case <-time.After(20 * time.Millisecond):
		}
		noFrame(t, end) // and drew no RST
	}
	end.send(t, good)
	end.next(t) // the RST
	if r := synResult(t, ch); r.Outcome != SYNAnswered {
		t.Fatalf("result %+v, want answered", r)
	}
}

func TestSYNProbeTimeoutAndCancel(t *testing.T) {
	f := newSYNFake(t)
	start := time.Now()
	if r := synResult(t, f.probe(synVIP4, 50*time.Millisecond)); r.Outcome != SYNTimeout || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("result %+v after %v, want timeout after 50ms", r, time.Since(start))
	}
	f.end(t, synSrc4.Addr()).next(t) // its SYN
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan SYNProbeResult, 1)
	go func() {
		ch <- f.p.Probe(ctx, SYNProbe{Interface: "eth0", OwnerMAC: synOwner, VIP: synVIP4, Timeout: time.Hour})
	}()
	f.end(t, synSrc4.Addr()).next(t)
	cancel()
	if r := synResult(t, ch); r.Outcome != SYNCanceled {
		t.Fatalf("result %+v, want canceled", r)
	}
	// A context that already ended: no SYN is sent.
	if r := f.p.Probe(ctx, SYNProbe{Interface: "eth0", OwnerMAC: synOwner, VIP: synVIP4}); r.Outcome != SYNCanceled {
		t.Fatalf("result %+v with an ended context, want canceled", r)
	}
	noFrame(t, f.end(t, synSrc4.Addr()))
}

// TestSYNProbeConcurrent runs many probes at once on one socket: each gets a
// port of its own and the answer to its own SYN, whatever order the
// answers come in.
func TestSYNProbeConcurrent(t *testing.T) {
	f := newSYNFake(t)
	const n = 200
	chs := make([]<-chan SYNProbeResult, n)
	vip := func(i int) netip.AddrPort { return netip.AddrPortFrom(vip1, uint16(8000+i%7)) }
	for i := range n {
		chs[i] = f.probe(vip(i), 20*time.Second)
	}
	end := f.end(t, synSrc4.Addr())
	syns := make([][]byte, n)
	ports := map[uint16]bool{}
	for i := range n {
		syns[i] = end.next(t)
		var s synReply
		parseSYNReply(syns[i], &s)
		if ports[s.src.Port()] {
			t.Fatalf("port %d used twice by probes in flight", s.src.Port())
		}
		ports[s.src.Port()] = true
	}
	// Answer in reverse order; refuse the probes of even VIP ports.
	refused := map[uint16]bool{}
	for i := n - 1; i >= 0; i-- {
		var s synReply
		parseSYNReply(syns[i], &s)
		flags := uint8(tcpSYN | tcpACK)
		if s.dst.Port()%2 == 0 {
			flags = tcpRST | tcpACK
			refused[s.src.Port()] = true
		}
		end.send(t, synReplyFrame(t, syns[i], flags, s.seq+1))
	}
	for i := range n {
		r := synResult(t, chs[i])
		want := SYNAnswered
		if refused[r.Src.Port()] {
			want = SYNRefused
		}
		if r.Outcome != want || (vip(i).Port()%2 == 0) != (want == SYNRefused) {
			t.Fatalf("probe %d of %s: %+v, want %s", i, vip(i), r, want)
		}
	}
	if len(f.opened) != 1 {
		t.Fatalf("sockets opened for %v, want one", f.opened)
	}
}

func TestSYNProbeSockets(t *testing.T) {
	f := newSYNFake(t)
	answer := func(src netip.Addr, nth int) {
		t.Helper()
		end := f.nthEnd(t, src, nth)
		syn := end.next(t)
		var s synReply
		parseSYNReply(syn, &s)
		end.send(t, synReplyFrame(t, syn, tcpRST|tcpACK, s.seq+1))
	}
	// probe runs pr, which must use the nth socket opened for src.
	probe := func(pr SYNProbe, src netip.Addr, nth int) {
		t.Helper()
		pr.Interface, pr.OwnerMAC, pr.Timeout = "eth0", synOwner, 10*time.Second
		ch := make(chan SYNProbeResult, 1)
		go func() { ch <- f.p.Probe(context.Background(), pr) }()
		answer(src, nth)
		if r := synResult(t, ch); r.Outcome != SYNRefused || r.Src.Addr() != src {
			t.Fatalf("probe %+v: %+v, want refused from %s", pr, r, src)
		}
	}
	probe(SYNProbe{VIP: synVIP4}, synSrc4.Addr(), 1)
	probe(SYNProbe{VIP: synVIP4}, synSrc4.Addr(), 1)
	probe(SYNProbe{VIP: synVIP6}, synSrc6.Addr(), 1)
	other := netip.MustParseAddr("192.0.2.77")
	probe(SYNProbe{VIP: synVIP4, Src: other}, other, 1) // replaces the idle IPv4 socket, not the IPv6 one
	probe(SYNProbe{VIP: synVIP6}, synSrc6.Addr(), 1)
	f.mu.Lock()
	f.link.Index = 3 // the interface was recreated
	f.mu.Unlock()
	probe(SYNProbe{VIP: synVIP6}, synSrc6.Addr(), 2)
	want := []netip.Addr{synSrc4.Addr(), synSrc6.Addr(), other, synSrc6.Addr()}
	if !slices.Equal(f.opened, want) {
		t.Fatalf("sockets opened for %v, want %v", f.opened, want)
	}
	for _, c := range f.ends[synSrc4.Addr()] {
		select {
		case <-c.peer.closed:
		default:
			t.Errorf("replaced IPv4 socket not closed")
		}
	}
	if len(f.p.socks) != 2 {
		t.Errorf("%d sockets open, want 2", len(f.p.socks))
	}
}

func TestSYNProbeRejects(t *testing.T) {
	f := newSYNFake(t)
	ctx := context.Background()
	ok := SYNProbe{Interface: "eth0", OwnerMAC: synOwner, VIP: synVIP4, Timeout: time.Millisecond}
	for _, tc := range []struct {
		name string
		edit func(*SYNProbe)
		want SYNOutcome
		err  string
	}{
		{"no VIP", func(p *SYNProbe) { p.VIP = netip.AddrPort{} }, SYNError, "invalid VIP"},
		{"port 0", func(p *SYNProbe) { p.VIP = netip.AddrPortFrom(vip1, 0) }, SYNError, "invalid VIP"},
		{"short MAC", func(p *SYNProbe) { p.OwnerMAC = p.OwnerMAC[:5] }, SYNError, "6-byte"},
		{"no interface name", func(p *SYNProbe) { p.Interface = "" }, SYNError, "no interface"},
		{"source of another family", func(p *SYNProbe) { p.Src = synSrc6.Addr() }, SYNError, "another family"},
		{"unknown interface", func(p *SYNProbe) { p.Interface = "eth9" }, SYNNoInterface, "no such interface"},
	} {
		pr := ok
		tc.edit(&pr)
		r := f.p.Probe(ctx, pr)
		if r.Outcome != tc.want || r.Err == nil || !strings.Contains(r.Err.Error(), tc.err) {
			t.Errorf("%s: %+v (%s), want %s with %q", tc.name, r, r.Why(), tc.want, tc.err)
		}
	}
	f.mu.Lock()
	f.link.Prefixes = []netip.Prefix{synSrc4}
	f.mu.Unlock()
	if r := f.p.Probe(ctx, SYNProbe{Interface: "eth0", OwnerMAC: synOwner, VIP: synVIP6}); r.Outcome != SYNNoInterface {
		t.Errorf("no IPv6 address: %s, want noInterface", r.Why())
	}
	f.mu.Lock()
	f.link.Up = false
	f.mu.Unlock()
	if r := f.p.Probe(ctx, ok); r.Outcome != SYNNoInterface || !strings.Contains(r.Err.Error(), "down") {
		t.Errorf("interface down: %s, want noInterface", r.Why())
	}
	f.mu.Lock()
	f.link.Up = true
	f.mu.Unlock()

	// Close wakes a probe in flight; later probes fail at once.
	ch := f.probe(synVIP4, time.Hour)
	f.end(t, synSrc4.Addr()).next(t)
	_ = f.p.Close()
	if r := synResult(t, ch); r.Outcome != SYNError || !errors.Is(r.Err, errSYNProberClosed) {
		t.Errorf("probe in flight at Close: %s", r.Why())
	}
	if r := f.p.Probe(ctx, ok); r.Outcome != SYNError || !errors.Is(r.Err, errSYNProberClosed) {
		t.Errorf("probe after Close: %s", r.Why())
	}
}

// synFuzzSockets returns IPv4 and IPv6 sockets with one probe in flight
// each (to synVIP4 and synVIP6), writing to a null conn.
func synFuzzSockets() (s4, s6 *synSocket, w4, w6 *synWaiter) {
	mk := func(src netip.Addr, vip netip.AddrPort, port uint16, isn uint32) (*synSocket, *synWaiter) {
		s := &synSocket{log: logr.Discard(), src: src, mac: [6]byte(mustMAC(eth0MAC)), conn: &nullConn{}, waiters: map[uint16]*synWaiter{}}
		w := &synWaiter{port: port, vip: vip, isn: isn, owner: [6]byte(synOwner), ch: make(chan synAnswer, 1)}
		s.waiters[port] = w
		return s, w
	}
	s4, w4 = mk(synSrc4.Addr(), synVIP4, 61000, 0x01020304)
	s6, w6 = mk(synSrc6.Addr(), synVIP6, 65535, 0xffffffff) // ISN+1 wraps to 0
	return s4, s6, w4, w6
}

func synFuzzSeeds() [][]byte {
	_, _, w4, w6 := synFuzzSockets()
	var buf [tcpFrameMax]byte
	mk := func(src, dst netip.AddrPort, flags uint8, ack uint32) []byte {
		return slices.Clone(writeTCP(buf[:], &tcpSegment{src: src, dst: dst, seq: 5, ack: ack, flags: flags, window: 1, mss: 1460}))
	}
	to4, to6 := netip.AddrPortFrom(synSrc4.Addr(), w4.port), netip.AddrPortFrom(synSrc6.Addr(), w6.port)
	sa4 := mk(synVIP4, to4, tcpSYN|tcpACK, w4.isn+1)
	sa6 := mk(synVIP6, to6, tcpSYN|tcpACK, w6.isn+1)
	withOpt := slices.Concat(sa4[:34], []byte{1, 1, 1, 1}, sa4[34:58])
	withOpt[14] = 0x46
	binary.BigEndian.PutUint16(withOpt[16:18], 20+4+24)
	return [][]byte{
		sa4, sa6, withOpt,
		mk(synVIP4, to4, tcpRST|tcpACK, w4.isn+1),
		mk(synVIP6, to6, tcpRST|tcpACK, w6.isn+1),
		mk(synVIP4, to4, tcpSYN|tcpACK, w4.isn),
		sa4[:53], sa6[:73], sa4[:14], {},
	}
}

// FuzzParseSYNReply runs the parser and the SYN prober's answer handler on
// arbitrary frames: no panic; what the parser accepts, x/net's IP header
// parsers read the same way; and a probe is answered only by a segment from
// its VIP:port to its address and port acknowledging its SYN.
func FuzzParseSYNReply(f *testing.F) {
	for _, s := range synFuzzSeeds() {
		f.Add(s)
	}
	s4, s6, w4, w6 := synFuzzSockets()
	h4, h6 := s4.handler(), s6.handler()
	f.Fuzz(func(t *testing.T, b []byte) {
		var r synReply
		if parseSYNReply(b, &r) {
			var src, dst net.IP
			switch r.src.Addr().Is4() {
			case true:
				h, err := ipv4.ParseHeader(b[14:])
				if err != nil || h.Version != 4 || h.Protocol != protoTCP || h.FragOff != 0 || h.Flags&ipv4.MoreFragments != 0 || h.Len < 20 {
					t.Fatalf("accepted an IPv4 frame x/net reads as %+v, %v", h, err)
				}
				src, dst = h.Src, h.Dst
				if tcp := b[14+h.Len:]; binary.BigEndian.Uint16(tcp[0:2]) != r.src.Port() || binary.BigEndian.Uint32(tcp[8:12]) != r.ack {
					t.Fatalf("TCP fields %+v differ from % x", r, tcp)
				}
			case false:
				h, err := ipv6.ParseHeader(b[14:])
				if err != nil || h.Version != 6 || h.NextHeader != protoTCP {
					t.Fatalf("accepted an IPv6 frame x/net reads as %+v, %v", h, err)
				}
				src, dst = h.Src, h.Dst
			}
			if !src.Equal(r.src.Addr().AsSlice()) || !dst.Equal(r.dst.Addr().AsSlice()) {
				t.Fatalf("addresses %s -> %s, x/net %s -> %s", r.src, r.dst, src, dst)
			}
		}
		h4(b)
		h6(b)
		for _, x := range []struct {
			s *synSocket
			w *synWaiter
		}{{s4, w4}, {s6, w6}} {
			select {
			case a := <-x.w.ch:
				if !parseSYNReply(b, &r) || r.src != x.w.vip || r.dst != netip.AddrPortFrom(x.s.src, x.w.port) ||
					r.ack != x.w.isn+1 || r.flags&tcpACK == 0 || r.flags&(tcpSYN|tcpRST) == 0 || a.refused != (r.flags&tcpRST != 0) {
					t.Fatalf("answer %+v delivered for % x", a, b)
				}
			default:
			}
		}
	})
}

// BenchmarkSYNFrames is the per-probe frame work: build a SYN, parse its
// answer, build the RST.
func BenchmarkSYNFrames(b *testing.B) {
	var buf, out [tcpFrameMax]byte
	src := netip.AddrPortFrom(synSrc4.Addr(), 61000)
	answer := slices.Clone(writeTCP(buf[:], &tcpSegment{src: synVIP4, dst: src, ack: 2, flags: tcpSYN | tcpACK, mss: 1460}))
	var r synReply
	b.ReportAllocs()
	for b.Loop() {
		writeTCP(buf[:], &tcpSegment{src: src, dst: synVIP4, seq: 1, flags: tcpSYN, window: synWindow, mss: 1460})
		if !parseSYNReply(answer, &r) {
			b.Fatal("answer does not parse")
		}
		writeTCP(out[:], &tcpSegment{src: r.dst, dst: r.src, seq: r.ack, flags: tcpRST})
	}
}
