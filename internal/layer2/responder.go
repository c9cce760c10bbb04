package layer2

import (
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
)

// ownedIP is one IP a responder answers for. An owned one is shared by
// every responder; a proxied one (see SetProxy) is per responder, since the
// MAC it answers with is per interface.
type ownedIP struct {
	addr netip.Addr
	m    *ipMetrics
	// proxied: answered on behalf of the host at mac (the ARP sender / NA
	// target link-layer address), never announced or probed for.
	proxied bool
	mac     [6]byte
	// handover: proxied for this node itself (mac is ours) after it gave
	// the IP away, until the new owner announces it (SetHandover).
	handover bool
}

// sameEntry reports whether a responder answering with cur needs no change
// to answer as want does (either may be nil: not answered).
func sameEntry(cur, want *ownedIP) bool {
	if cur == nil || want == nil {
		return cur == want
	}
	return cur == want || (cur.proxied && want.proxied && cur.mac == want.mac && cur.handover == want.handover)
}

// ownedSet is the immutable set of IPs one responder answers for. The
// announcer builds a new set on every change and swaps it in atomically, so
// the read loops never lock and a removed IP is not answered once the swap
// is done. It is sharded by the address's last byte so that a change copies
// one small shard map (plus the shard arrays) instead of every owned IP:
// load-balancer IPs are allocated sequentially, so shards stay balanced.
type ownedSet struct {
	v4     [ownedShards]map[uint32]*ownedIP
	v6     [ownedShards]map[[16]byte]*ownedIP
	n4, n6 int
}

const ownedShards = 256

func newOwnedSet() *ownedSet { return &ownedSet{} }

// get4 and get6 look an address up; lookups in a nil shard map return nil.
func (s *ownedSet) get4(k uint32) *ownedIP   { return s.v4[k&(ownedShards-1)][k] }
func (s *ownedSet) get6(k [16]byte) *ownedIP { return s.v6[k[15]][k] }

// get returns ip's entry, nil if not answered (or s is nil).
func (s *ownedSet) get(ip netip.Addr) *ownedIP {
	switch {
	case s == nil:
		return nil
	case ip.Is4():
		return s.get4(v4key(ip))
	default:
		return s.get6(ip.As16())
	}
}

// owns reports whether ip is owned, not merely proxied: only owned IPs are
// announced, probed for and defended.
func (s *ownedSet) owns(ip netip.Addr) bool {
	o := s.get(ip)
	return o != nil && !o.proxied
}

// setEditor derives a new ownedSet from an old one, copying each shard it
// touches once.
type setEditor struct {
	s      *ownedSet
	copied [2][ownedShards]bool
}

func editSet(old *ownedSet) *setEditor {
	s := newOwnedSet()
	if old != nil {
		*s = *old
	}
	return &setEditor{s: s}
}

func (e *setEditor) shard4(k uint32) map[uint32]*ownedIP {
	i := k & (ownedShards - 1)
	if !e.copied[0][i] {
		m := make(map[uint32]*ownedIP, len(e.s.v4[i])+1)
		maps.Copy(m, e.s.v4[i])
		e.s.v4[i], e.copied[0][i] = m, true
	}
	return e.s.v4[i]
}

func (e *setEditor) shard6(k [16]byte) map[[16]byte]*ownedIP {
	i := k[15]
	if !e.copied[1][i] {
		m := make(map[[16]byte]*ownedIP, len(e.s.v6[i])+1)
		maps.Copy(m, e.s.v6[i])
		e.s.v6[i], e.copied[1][i] = m, true
	}
	return e.s.v6[i]
}

func (e *setEditor) add(o *ownedIP) {
	if o.addr.Is4() {
		k := v4key(o.addr)
		m := e.shard4(k)
		if m[k] == nil {
			e.s.n4++
		}
		m[k] = o
		return
	}
	k := o.addr.As16()
	m := e.shard6(k)
	if m[k] == nil {
		e.s.n6++
	}
	m[k] = o
}

func (e *setEditor) remove(ip netip.Addr) {
	if ip.Is4() {
		k := v4key(ip)
		if m := e.shard4(k); m[k] != nil {
			delete(m, k)
			e.s.n4--
		}
		return
	}
	k := ip.As16()
	if m := e.shard6(k); m[k] != nil {
		delete(m, k)
		e.s.n6--
	}
}

// v4Keys lists the owned IPv4 addresses, sorted.
func (s *ownedSet) v4Keys() []uint32 {
	out := make([]uint32, 0, s.n4)
	for _, m := range s.v4 {
		for k := range m {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// MulticastGroups joins and leaves IPv6 multicast groups on one interface.
// *ndp.Conn implements it; joining the solicited-node group of an owned IPv6
// address makes the NIC deliver the multicast Neighbor Solicitations for it.
type MulticastGroups interface {
	JoinGroup(group netip.Addr) error
	LeaveGroup(group netip.Addr) error
	Close() error
}

// responder answers ARP and NDP on one interface.
type responder struct {
	log   logr.Logger
	link  Link
	mac   [6]byte
	arp   net.PacketConn  // nil: no ARP on this interface
	ndp   net.PacketConn  // nil: no NDP on this interface
	group MulticastGroups // non-nil when ndp is

	owned atomic.Pointer[ownedSet]
	// isLocal reports whether a MAC belongs to this node (any interface), so
	// our own frames seen on another interface are not conflicts.
	isLocal func([6]byte) bool
	// conflict is called from the read loops when another MAC claims an
	// owned IP.
	conflict func(o *ownedIP, mac [6]byte, iface string)
	// held reports whether the announcer holds every answer (Hold).
	held func() bool
	// noKernelOwnedFilter keeps the generic ARP socket filter (benchmarks).
	noKernelOwnedFilter bool

	// groups counts owned IPv6 addresses per solicited-node group; guarded
	// by the announcer's mutex.
	groups map[netip.Addr]int

	closed atomic.Bool
	wg     sync.WaitGroup
}

var broadcastMAC = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (r *responder) start() {
	if r.arp != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serve(r.arp, r.serveARPFrame())
		}()
	}
	if r.ndp != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serve(r.ndp, r.serveNDPFrame())
		}()
	}
}

// updateKernelFilter narrows the ARP socket's kernel filter to the current
// owned IPv4 set, so frames about other addresses never reach user space.
// It runs after the owned set is swapped: an IP just removed is already not
// answered; one just added is answered once the filter lets it through.
// Sockets without SetBPF (test seams) keep relying on the user-space check,
// which stays in place either way.
func (r *responder) updateKernelFilter() {
	c, ok := r.arp.(interface {
		SetBPF([]bpf.RawInstruction) error
	})
	if !ok || r.arp == nil || r.noKernelOwnedFilter {
		return
	}
	set := r.owned.Load()
	var (
		prog []bpf.RawInstruction
		err  error
	)
	if set.n4 <= maxKernelFilterIPs {
		prog, err = ownedARPFilter(set.v4Keys())
	} else {
		prog, err = arpFilter()
	}
	if err == nil {
		err = c.SetBPF(prog)
	}
	if err != nil {
		r.log.Error(err, "updating the ARP socket filter failed; falling back to the generic ARP filter")
		if prog, err := arpFilter(); err == nil {
			_ = c.SetBPF(prog)
		}
	}
}

// close stops the read loops and waits for them.
func (r *responder) close() {
	r.closed.Store(true)
	if r.arp != nil {
		_ = r.arp.Close()
	}
	if r.ndp != nil {
		_ = r.ndp.Close()
	}
	if r.group != nil {
		_ = r.group.Close()
	}
	r.wg.Wait()
}

// serve reads frames until the conn is closed.
func (r *responder) serve(c net.PacketConn, handle func([]byte)) {
	readFrames(r.log, c, &r.closed, handle)
}

// readFrames reads frames from c into one buffer and hands each to handle,
// until c is closed (or closed is set). A read error other than closing (the
// interface going down gives ENETDOWN once) is logged and the loop pauses
// briefly so a persistent error cannot spin.
func readFrames(log logr.Logger, c net.PacketConn, closed *atomic.Bool, handle func([]byte)) {
	buf := make([]byte, 1600)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			if closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			log.V(1).Info("read failed", "error", err.Error())
			time.Sleep(100 * time.Millisecond)
			continue
		}
		handle(buf[:n])
	}
}

// serveARPFrame returns the per-frame ARP handler with its own reply buffer
// and destination address, so the hot path does not allocate.
func (r *responder) serveARPFrame() func([]byte) {
	var f arpFrame
	out := make([]byte, minFrameLen)
	dst := &packet.Addr{HardwareAddr: make(net.HardwareAddr, 6)}
	return func(b []byte) { r.handleARP(b, &f, out, dst) }
}

// handleARP is the ARP policy. It reads fixed offsets, then looks the sender
// and target IPs up in the owned set: for the flood of requests for other
// hosts' IPs this is all the work done.
func (r *responder) handleARP(b []byte, f *arpFrame, out []byte, dst *packet.Addr) {
	if !parseARP(b, f) {
		return
	}
	set := r.owned.Load()
	if set == nil || set.n4 == 0 {
		return
	}
	// Any ARP frame (reply, gratuitous request, plain request) whose sender
	// is an owned IP with a foreign MAC means someone else uses that IP.
	if o := set.get4(f.spa); o != nil && r.foreign(o, f.sha) {
		r.conflict(o, f.sha, r.link.Name)
	}
	if f.op != arpOpRequest {
		return
	}
	o := set.get4(f.tpa)
	if o == nil {
		return
	}
	// A gratuitous request (sender IP == target IP) announces, it does not
	// ask; a frame from our own MAC is our own probe or announcement.
	if f.spa == f.tpa || f.sha == r.mac {
		return
	}
	// The host a proxied IP is answered for knows its own addresses.
	if o.proxied && f.sha == o.mac {
		return
	}
	if f.ethDst != broadcastMAC && f.ethDst != r.mac {
		return
	}
	o.m.requests.Inc()
	if r.held() {
		return
	}
	frame := appendARPReply(out, r.mac, r.answerMAC(o), f.tpa, f.sha, f.spa)
	copy(dst.HardwareAddr, f.sha[:])
	if _, err := r.arp.WriteTo(frame, dst); err != nil {
		r.log.Error(err, "sending ARP reply failed", "ip", o.addr.String())
		return
	}
	o.m.responses.Inc()
	if v := r.log.V(2); v.Enabled() {
		v.Info("answered ARP request", "ip", o.addr.String(), "requester", net.HardwareAddr(f.sha[:]).String())
	}
}

func (r *responder) serveNDPFrame() func([]byte) {
	var f ndpFrame
	return func(b []byte) { r.handleNDP(b, &f) }
}

// handleNDP is the NDP policy: answer solicitations for owned targets
// (multicast to the solicited-node group, or unicast for neighbour
// unreachability detection), and report advertisements for owned targets
// from another MAC.
func (r *responder) handleNDP(b []byte, f *ndpFrame) {
	if !parseNDP(b, f) {
		return
	}
	set := r.owned.Load()
	if set == nil || set.n6 == 0 {
		return
	}
	o := set.get6(f.target)
	if o == nil {
		return
	}
	if f.typ == icmpTypeNA {
		mac := f.ethSrc
		if f.hasLLA {
			mac = f.lla
		}
		if r.foreign(o, mac) {
			r.conflict(o, mac, r.link.Name)
		}
		return
	}
	if f.ethSrc == r.mac || (o.proxied && (f.ethSrc == o.mac || (f.hasLLA && f.lla == o.mac))) {
		return
	}
	dstIP := netip.AddrFrom16(f.dst)
	if dstIP != o.addr && dstIP != solicitedNodeGroup(o.addr) {
		return
	}
	if f.ethDst != r.mac && f.ethDst[0]&1 == 0 {
		return
	}
	o.m.requests.Inc()
	if r.held() {
		return
	}
	lla := r.answerMAC(o)
	src := netip.AddrFrom16(f.src)
	var (
		frame []byte
		err   error
	)
	if src.IsUnspecified() {
		// Duplicate address detection by another host: RFC 4861 7.2.4 says
		// answer to all-nodes, not solicited. This defends the address;
		// a proxy answer never overrides (the host itself may be answering).
		frame, err = buildNA(r.link.MAC, lla, o.addr, ipv6AllNodes, multicastMAC(ipv6AllNodes), o.addr, false, !o.proxied)
	} else {
		dstMAC := f.ethSrc
		if f.hasLLA {
			dstMAC = f.lla
		}
		frame, err = buildNA(r.link.MAC, lla, o.addr, src, dstMAC, o.addr, true, solicitedOverride)
	}
	if err == nil {
		_, err = r.ndp.WriteTo(frame, &packet.Addr{HardwareAddr: net.HardwareAddr(frame[0:6])})
	}
	if err != nil {
		r.log.Error(err, "sending neighbor advertisement failed", "ip", o.addr.String())
		return
	}
	o.m.responses.Inc()
}

// answerMAC is the MAC an answer for o carries in its payload: ours, or the
// proxied host's.
func (r *responder) answerMAC(o *ownedIP) [6]byte {
	if o.proxied {
		return o.mac
	}
	return r.mac
}

// foreign reports whether a frame claiming o from mac is another host's
// claim: not from this node, and for a proxied IP not from the host it is
// answered for.
func (r *responder) foreign(o *ownedIP, mac [6]byte) bool {
	return mac != r.mac && !r.isLocal(mac) && (!o.proxied || mac != o.mac)
}

// solicitedOverride is the Override flag of solicited advertisements. It is
// false, as MetalLB sends: a solicited answer then only fills an incomplete
// entry and never flips a client's existing entry; takeovers flip entries
// with unsolicited Override advertisements instead.
const solicitedOverride = false

// sendProbe asks whether anyone else holds ip on this interface without
// announcing anything: an RFC 5227 ARP probe (sender IP 0.0.0.0) for IPv4, a
// duplicate-address-detection solicitation (source ::) for IPv6. A holder
// answers with a reply or a defending advertisement, which the read loops
// report as a conflict.
func (r *responder) sendProbe(ip netip.Addr) error {
	var b []byte
	var err error
	if ip.Is4() {
		b, err = arpProbe(r.link.MAC, ip)
	} else {
		b, err = buildDADProbe(r.link.MAC, ip)
	}
	if err != nil {
		return err
	}
	return r.writeFrame(ip, b)
}

// announcement is one frame of a gratuitous burst.
type announcement struct {
	b []byte
	// probe: the RFC 5227 probe, which announces nothing (not counted as
	// a gratuitous frame).
	probe bool
}

// gratuitousFrames returns the frames that announce ip on this interface,
// most useful first: for IPv4 the gratuitous request (RFC 5227's
// announcement), the gratuitous reply (for hosts that only learn from
// replies), then, with probe, the RFC 5227 probe, which only detects a
// conflict; for IPv6 an unsolicited Override advertisement to all nodes. None
// when the interface has no socket for ip's family.
func (r *responder) gratuitousFrames(ip netip.Addr, probe bool) ([]announcement, error) {
	if !ip.Is4() {
		if r.ndp == nil {
			return nil, nil
		}
		b, err := buildNA(r.link.MAC, r.mac, ip, ipv6AllNodes, multicastMAC(ipv6AllNodes), ip, false, true)
		if err != nil {
			return nil, err
		}
		return []announcement{{b: b}}, nil
	}
	if r.arp == nil {
		return nil, nil
	}
	frames, err := gratuitousARP(r.link.MAC, ip)
	if err != nil {
		return nil, err
	}
	out := make([]announcement, 0, len(frames)+1)
	for _, b := range frames {
		out = append(out, announcement{b: b})
	}
	if probe {
		b, err := arpProbe(r.link.MAC, ip)
		if err != nil {
			return nil, err
		}
		out = append(out, announcement{b: b, probe: true})
	}
	return out, nil
}

// writeFrame sends a frame built for ip's family: ARP frames to the
// broadcast address, NDP frames to their own destination MAC. Nothing when
// the interface has no socket for that family.
func (r *responder) writeFrame(ip netip.Addr, b []byte) error {
	var err error
	switch {
	case ip.Is4() && r.arp != nil:
		_, err = r.arp.WriteTo(b, &packet.Addr{HardwareAddr: net.HardwareAddr(broadcastMAC[:])})
	case !ip.Is4() && r.ndp != nil:
		_, err = r.ndp.WriteTo(b, &packet.Addr{HardwareAddr: net.HardwareAddr(b[0:6])})
	}
	return err
}
