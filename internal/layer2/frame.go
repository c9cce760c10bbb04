package layer2

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// Frame layout constants. Responders read whole Ethernet frames from an
// AF_PACKET socket, so offsets start at the Ethernet header.
const (
	ethHeaderLen = 14
	arpFrameLen  = ethHeaderLen + 28 // Ethernet + ARP for Ethernet/IPv4
	minFrameLen  = 60                // shortest Ethernet frame without FCS

	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86dd

	ipv6HeaderLen = 40
	protoICMPv6   = 58
	ndpHopLimit   = 255

	icmpTypeNS = 135
	icmpTypeNA = 136

	ndpOptSourceLLA = 1
	ndpOptTargetLLA = 2

	arpOpRequest = 1
	arpOpReply   = 2
)

// arpFrame is the part of an Ethernet/IPv4 ARP frame the responder needs. It
// is filled in place from the read buffer without allocating.
type arpFrame struct {
	ethDst [6]byte
	op     uint16
	sha    [6]byte
	spa    uint32
	tpa    uint32
}

// parseARP reads an Ethernet/IPv4 ARP frame. It returns false for anything
// else: short frames, other EtherTypes (including VLAN-tagged ones, which the
// kernel untags for VLAN interfaces), other hardware or protocol types. It
// reads only fixed offsets, so the cost for a flood of foreign requests is a
// few comparisons.
func parseARP(b []byte, f *arpFrame) bool {
	if len(b) < arpFrameLen {
		return false
	}
	if binary.BigEndian.Uint16(b[12:14]) != etherTypeARP ||
		binary.BigEndian.Uint16(b[14:16]) != 1 || // hardware type Ethernet
		binary.BigEndian.Uint16(b[16:18]) != 0x0800 || // protocol type IPv4
		b[18] != 6 || b[19] != 4 {
		return false
	}
	copy(f.ethDst[:], b[0:6])
	f.op = binary.BigEndian.Uint16(b[20:22])
	copy(f.sha[:], b[22:28])
	f.spa = binary.BigEndian.Uint32(b[28:32])
	f.tpa = binary.BigEndian.Uint32(b[38:42])
	return true
}

// appendARPReply writes into buf (at least minFrameLen bytes) the ARP reply
// that tells the requester (reqMAC, reqIP) that ip is at mac, addressed
// unicast to the requester's hardware address from ethSrc. With ethSrc ==
// mac it is the same frame mdlayher/arp's Client.Reply sends; a proxy answer
// has our MAC as ethSrc, so switches keep learning the proxied MAC from its
// own port. It returns the frame.
func appendARPReply(buf []byte, ethSrc, mac [6]byte, ip uint32, reqMAC [6]byte, reqIP uint32) []byte {
	return appendARP(buf, arpOpReply, reqMAC, ethSrc, mac, ip, reqMAC, reqIP)
}

// appendARPProbe writes into buf (at least minFrameLen bytes) an RFC 5227
// probe for ip from mac to ethDst (broadcast, or a MAC already known for
// ip): a request with sender IP 0.0.0.0, which the holder of ip answers
// without touching its neighbour table, and target hardware address zero.
func appendARPProbe(buf []byte, mac, ethDst [6]byte, ip uint32) []byte {
	return appendARP(buf, arpOpRequest, ethDst, mac, mac, 0, [6]byte{}, ip)
}

// appendARP writes an Ethernet/IPv4 ARP frame into buf (at least
// minFrameLen bytes, zero-padded) without allocating and returns it.
func appendARP(buf []byte, op uint16, ethDst, ethSrc, sha [6]byte, spa uint32, tha [6]byte, tpa uint32) []byte {
	b := buf[:minFrameLen]
	copy(b[0:6], ethDst[:])
	copy(b[6:12], ethSrc[:])
	binary.BigEndian.PutUint16(b[12:14], etherTypeARP)
	binary.BigEndian.PutUint16(b[14:16], 1)
	binary.BigEndian.PutUint16(b[16:18], 0x0800)
	b[18], b[19] = 6, 4
	binary.BigEndian.PutUint16(b[20:22], op)
	copy(b[22:28], sha[:])
	binary.BigEndian.PutUint32(b[28:32], spa)
	copy(b[32:38], tha[:])
	binary.BigEndian.PutUint32(b[38:42], tpa)
	clear(b[42:])
	return b
}

// arpFrames builds an ARP frame with mdlayher/arp and mdlayher/ethernet. It is
// used for the rare frames (gratuitous ARP, probes), where clarity beats
// allocation counts.
func arpFrameBytes(op arp.Operation, srcMAC net.HardwareAddr, srcIP netip.Addr, dstMAC net.HardwareAddr, dstIP netip.Addr, ethDst net.HardwareAddr) ([]byte, error) {
	p, err := arp.NewPacket(op, srcMAC, srcIP, dstMAC, dstIP)
	if err != nil {
		return nil, fmt.Errorf("building ARP %s for %s: %w", op, dstIP, err)
	}
	pb, err := p.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("marshalling ARP %s for %s: %w", op, dstIP, err)
	}
	f := &ethernet.Frame{Destination: ethDst, Source: srcMAC, EtherType: ethernet.EtherTypeARP, Payload: pb}
	return f.MarshalBinary()
}

// gratuitousARP returns the two gratuitous frames announcing that ip is at
// mac: a request and a reply, both broadcast with sender and target IP set to
// ip, because some clients honour only one of the two kinds.
func gratuitousARP(mac net.HardwareAddr, ip netip.Addr) ([][]byte, error) {
	out := make([][]byte, 0, 2)
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		b, err := arpFrameBytes(op, mac, ip, ethernet.Broadcast, ip, ethernet.Broadcast)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// arpProbe returns an RFC 5227 probe for ip: a broadcast request with sender
// IP 0.0.0.0, so it does not pollute other hosts' caches, which any current
// holder of ip answers.
func arpProbe(mac net.HardwareAddr, ip netip.Addr) ([]byte, error) {
	if len(mac) != 6 || !ip.Is4() {
		return nil, fmt.Errorf("building ARP probe for %s from %s: need an IPv4 address and a 6-byte MAC", ip, mac)
	}
	return appendARPProbe(make([]byte, minFrameLen), [6]byte(mac), broadcastMAC, v4key(ip)), nil
}

// ndpFrame is the part of an Ethernet/IPv6/ICMPv6 Neighbor Solicitation or
// Advertisement the responder needs.
type ndpFrame struct {
	ethSrc [6]byte
	ethDst [6]byte
	src    [16]byte // IPv6 source
	dst    [16]byte // IPv6 destination
	typ    uint8    // icmpTypeNS or icmpTypeNA
	flags  uint8    // NA: R, S, O bits in the top three bits
	target [16]byte
	lla    [6]byte // source (NS) or target (NA) link-layer address option
	hasLLA bool
}

// parseNDP reads an Ethernet/IPv6 frame carrying a Neighbor Solicitation or
// Advertisement directly after the IPv6 header (RFC 4861 messages never carry
// extension headers in practice). It enforces the RFC 4861 validity checks
// that matter here: hop limit 255, code 0, ICMPv6 length >= 24, options with
// non-zero lengths that fit. The checksum is not verified: the kernel already
// dropped frames with bad Ethernet FCS and a spoofer can compute a checksum.
func parseNDP(b []byte, f *ndpFrame) bool {
	const icmpOff = ethHeaderLen + ipv6HeaderLen
	if len(b) < icmpOff+24 {
		return false
	}
	if binary.BigEndian.Uint16(b[12:14]) != etherTypeIPv6 || b[14]>>4 != 6 ||
		b[14+6] != protoICMPv6 || b[14+7] != ndpHopLimit {
		return false
	}
	plen := int(binary.BigEndian.Uint16(b[14+4 : 14+6]))
	if plen < 24 || icmpOff+plen > len(b) {
		return false
	}
	icmp := b[icmpOff : icmpOff+plen]
	if (icmp[0] != icmpTypeNS && icmp[0] != icmpTypeNA) || icmp[1] != 0 {
		return false
	}
	copy(f.ethDst[:], b[0:6])
	copy(f.ethSrc[:], b[6:12])
	copy(f.src[:], b[14+8:14+24])
	copy(f.dst[:], b[14+24:14+40])
	f.typ = icmp[0]
	f.flags = icmp[4] & 0xe0
	copy(f.target[:], icmp[8:24])
	f.hasLLA = false
	want := byte(ndpOptSourceLLA)
	if f.typ == icmpTypeNA {
		want = ndpOptTargetLLA
	}
	for opts := icmp[24:]; len(opts) > 0; {
		if len(opts) < 8 {
			return false
		}
		l := int(opts[1]) * 8
		if l == 0 || l > len(opts) {
			return false
		}
		if opts[0] == want && l == 8 {
			copy(f.lla[:], opts[2:8])
			f.hasLLA = true
		}
		opts = opts[l:]
	}
	return true
}

// ipv6AllNodes is ff02::1, the destination of unsolicited advertisements.
var ipv6AllNodes = netip.MustParseAddr("ff02::1")

// multicastMAC returns the Ethernet address IPv6 multicast ip maps to
// (RFC 2464: 33:33 followed by the low 32 bits).
func multicastMAC(ip netip.Addr) [6]byte {
	a := ip.As16()
	return [6]byte{0x33, 0x33, a[12], a[13], a[14], a[15]}
}

// buildNA returns an Ethernet frame from ethSrc carrying a Neighbor
// Advertisement for target with lla in the target link-layer address option
// (our MAC, or a proxied host's), from srcIP to dstIP / dstMAC. Callers source it from the target address itself, as the
// Linux kernel does for its own addresses: some clients (ndisc6) only accept
// an advertisement whose source is the target. The ICMPv6 body and checksum
// come from mdlayher/ndp; the IPv6 and Ethernet headers are written here
// because the frame goes out through the same AF_PACKET socket the
// solicitation came in on (the kernel does not own the target address, so
// its IPv6 stack would neither receive unicast solicitations nor resolve the
// requester for us).
func buildNA(ethSrc net.HardwareAddr, lla [6]byte, srcIP, dstIP netip.Addr, dstMAC [6]byte, target netip.Addr, solicited, override bool) ([]byte, error) {
	return buildNDP(ethSrc, srcIP, dstIP, dstMAC, &ndp.NeighborAdvertisement{
		Solicited:     solicited,
		Override:      override,
		TargetAddress: target,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: net.HardwareAddr(lla[:])}},
	})
}

// buildDADProbe returns a duplicate address detection solicitation for
// target (RFC 4862 5.4.2: source ::, to the solicited-node group, no source
// link-layer option). A host holding target defends it with an advertisement
// to all nodes.
func buildDADProbe(mac net.HardwareAddr, target netip.Addr) ([]byte, error) {
	g := solicitedNodeGroup(target)
	return buildNDP(mac, netip.IPv6Unspecified(), g, multicastMAC(g), &ndp.NeighborSolicitation{TargetAddress: target})
}

// buildNS returns a Neighbor Solicitation for target from srcIP (a
// link-local address of this interface) with our MAC as source link-layer
// address option, to dstIP / dstMAC: the solicited-node group of target, or
// target itself unicast to its known MAC.
func buildNS(mac net.HardwareAddr, srcIP, dstIP netip.Addr, dstMAC [6]byte, target netip.Addr) ([]byte, error) {
	return buildNDP(mac, srcIP, dstIP, dstMAC, &ndp.NeighborSolicitation{
		TargetAddress: target,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: mac}},
	})
}

// buildNDP wraps an NDP message in IPv6 (hop limit 255) and Ethernet.
func buildNDP(mac net.HardwareAddr, srcIP, dstIP netip.Addr, dstMAC [6]byte, m ndp.Message) ([]byte, error) {
	body, err := ndp.MarshalMessageChecksum(m, srcIP.WithZone(""), dstIP.WithZone(""))
	if err != nil {
		return nil, fmt.Errorf("building %s to %s: %w", m.Type(), dstIP, err)
	}
	b := make([]byte, ethHeaderLen+ipv6HeaderLen+len(body))
	copy(b[0:6], dstMAC[:])
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], etherTypeIPv6)
	ip := b[ethHeaderLen:]
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(body)))
	ip[6] = protoICMPv6
	ip[7] = ndpHopLimit
	s, d := srcIP.As16(), dstIP.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	copy(ip[40:], body)
	return b, nil
}

// v4key and v4addr convert between the uint32 form used by the fast path and
// netip.Addr.
func v4key(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func v4addr(k uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], k)
	return netip.AddrFrom4(b)
}
