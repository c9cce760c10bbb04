package secondchance

import (
	"net"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

const (
	// chainName is the table's only chain, a base chain at the interface's
	// netdev ingress hook.
	chainName = "ingress"

	// chainPriority runs the chain before any other netdev ingress chain a
	// node may have at the default priority (0): the forwarded packets must
	// leave before anything else sees (and perhaps accounts or drops) them.
	chainPriority = -500

	// localTimeout is how long a flow this node serves stays known without a
	// packet. Each packet refreshes it; a flow idle longer is forwarded to
	// the previous owner, which has no state for it and resets it.
	localTimeout = 10 * time.Minute

	// forwardedTimeout is how long a forwarded flow stays in the forwarded
	// set (statistics only) after its last packet.
	forwardedTimeout = 2 * time.Minute

	// localSize and forwardedSize bound the dynamic sets, so that a SYN flood
	// during a move cannot exhaust the node's memory. A SYN that finds the
	// local set full is not recorded, so it and all the later packets of its
	// flow go to the previous owner, which serves the whole flow: a full set
	// degrades into forwarding, never into a flow split between two nodes.
	localSize     = 1 << 18
	forwardedSize = 1 << 16

	// etherAddrLen is the length of a MAC address.
	etherAddrLen = 6
)

// Registers. regScratch is the 16-byte NFT_REG_1; the flow key of a
// concatenation is loaded into consecutive 32-bit registers from regFlow on
// (each field padded to a multiple of 4 bytes), which is what the kernel
// reads for a concatenated set key. NFT_REG_1 overlaps NFT_REG32_00..03, so
// every rule finishes with the scratch register before loading a flow key.
const (
	regScratch = unix.NFT_REG_1
	regFlow    = unix.NFT_REG32_00
)

// Header offsets.
const (
	etherDaddrOff = 0 // link-layer header
	etherSaddrOff = 6
	tcpSportOff   = 0 // transport header
	tcpDportOff   = 2
	tcpFlagsOff   = 13
	portLen       = 2

	tcpFlagSYN = 0x02
	tcpFlagACK = 0x10
)

// family describes what the rules of one IP version read, and the names of
// its sets.
type family struct {
	etherType        [2]byte // meta protocol, network byte order
	addrLen          uint32
	saddrOff         uint32 // in the network header
	daddrOff         uint32
	addrType         nftables.SetDatatype
	vips             string // map VIP : previous owner's MAC
	local            string // flows this node saw start
	forwarded        string // flows sent on recently
	forwardedPackets string // counter object of the forward rule
}

var (
	ipv4 = family{
		etherType: [2]byte{0x08, 0x00}, addrLen: 4, saddrOff: 12, daddrOff: 16,
		addrType: nftables.TypeIPAddr,
		vips:     "vips4", local: "local4", forwarded: "forwarded4", forwardedPackets: "forwarded_packets4",
	}
	ipv6 = family{
		etherType: [2]byte{0x86, 0xdd}, addrLen: 16, saddrOff: 8, daddrOff: 24,
		addrType: nftables.TypeIP6Addr,
		vips:     "vips6", local: "local6", forwarded: "forwarded6", forwardedPackets: "forwarded_packets6",
	}
	families = []*family{&ipv4, &ipv6}
)

// flowType is the key type of the flow sets: saddr . sport . daddr . dport.
func (f *family) flowType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, nftables.TypeInetService, f.addrType, nftables.TypeInetService)
}

// flowVIP returns the destination address of a flow set key (flowType:
// each part padded to 4 bytes, so daddr follows saddr and sport's 4 bytes).
func (f *family) flowVIP(key []byte) (netip.Addr, bool) {
	off := int(f.addrLen) + 4
	if len(key) < off+int(f.addrLen) {
		return netip.Addr{}, false
	}
	return netip.AddrFromSlice(key[off : off+int(f.addrLen)])
}

// objects are the sets, map and counter of one family in table tb, created
// once with the table and never recreated: the local set must survive every
// later Set.
type objects struct {
	vips, local, forwarded *nftables.Set
	counter                *nftables.CounterObj
}

func (f *family) objects(tb *nftables.Table) objects {
	flows := f.flowType()
	return objects{
		vips: &nftables.Set{Table: tb, Name: f.vips, IsMap: true, KeyType: f.addrType, DataType: nftables.TypeEtherAddr,
			Comment: "forwarded IP : previous owner's MAC"},
		local: &nftables.Set{Table: tb, Name: f.local, KeyType: flows, Concatenation: true,
			Dynamic: true, HasTimeout: true, Timeout: localTimeout, Size: localSize,
			Comment: "flows whose SYN this node saw: served here"},
		forwarded: &nftables.Set{Table: tb, Name: f.forwarded, KeyType: flows, Concatenation: true,
			Dynamic: true, HasTimeout: true, Timeout: forwardedTimeout, Size: forwardedSize,
			Comment: "flows sent on to the previous owner recently"},
		counter: &nftables.CounterObj{Table: tb, Name: f.forwardedPackets},
	}
}

// match is the start of every rule of the family: a TCP packet of the
// family addressed to this host. Only frames sent to this interface's MAC
// are handled, so that a frame flooded to a promiscuous interface (one meant
// for the previous owner, say) is never sent on a second time.
func (f *family) match() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: []byte{unix.PACKET_HOST}},
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: f.etherType[:]},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: []byte{unix.IPPROTO_TCP}},
	}
}

// loadDaddr loads the packet's destination IP into regScratch.
func (f *family) loadDaddr() expr.Any {
	return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: regScratch,
		Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen}
}

// isForwarded matches a packet whose destination is a forwarded IP.
func (f *family) isForwarded(o objects) []expr.Any {
	return []expr.Any{f.loadDaddr(), &expr.Lookup{SourceRegister: regScratch, SetName: o.vips.Name, SetID: o.vips.ID}}
}

// loadFlow loads the packet's flow key into the registers from regFlow on.
func (f *family) loadFlow() []expr.Any {
	var out []expr.Any
	reg := uint32(regFlow)
	load := func(base expr.PayloadBase, off, n uint32) {
		out = append(out, &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: reg, Base: base, Offset: off, Len: n})
		reg += (n + 3) / 4
	}
	load(expr.PayloadBaseNetworkHeader, f.saddrOff, f.addrLen)
	load(expr.PayloadBaseTransportHeader, tcpSportOff, portLen)
	load(expr.PayloadBaseNetworkHeader, f.daddrOff, f.addrLen)
	load(expr.PayloadBaseTransportHeader, tcpDportOff, portLen)
	return out
}

// updateFlow adds the flow key loaded by loadFlow to set s, or refreshes its
// timeout. It fails (ending the rule) only when s is full.
func updateFlow(s *nftables.Set) expr.Any {
	return &expr.Dynset{SrcRegKey: regFlow, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE}
}

// rules returns the family's rules, in order. ownMAC is this interface's
// MAC, the source of the frames sent on.
//
// The invariant: a packet to a forwarded IP is served here if and only if
// its flow is in the local set, and a flow enters the local set only by its
// first packet (a SYN without ACK) reaching this node. Every other packet to
// a forwarded IP (one of a flow established at the previous owner before the
// move) is sent on, unchanged but for its Ethernet addresses, to the
// previous owner, which still has its socket or its conntrack/NAT entry.
func (f *family) rules(o objects, ownMAC net.HardwareAddr) [][]expr.Any {
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	accept := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	// A flow starts here: remember it, serve it.
	started := cat(f.match(), f.isForwarded(o), []expr.Any{
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: regScratch,
			Base: expr.PayloadBaseTransportHeader, Offset: tcpFlagsOff, Len: 1},
		&expr.Bitwise{SourceRegister: regScratch, DestRegister: regScratch, Len: 1,
			Mask: []byte{tcpFlagSYN | tcpFlagACK}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: []byte{tcpFlagSYN}},
	}, f.loadFlow(), []expr.Any{updateFlow(o.local)}, accept)
	// A flow that started here: serve it, keep it known.
	known := cat(f.match(), f.isForwarded(o), f.loadFlow(), []expr.Any{
		&expr.Lookup{SourceRegister: regFlow, SetName: o.local.Name, SetID: o.local.ID},
		updateFlow(o.local),
	}, accept)
	// Any other flow is the previous owner's. Recording it is a rule of its
	// own, without a verdict, so that a full forwarded set (statistics only)
	// never keeps a packet from being sent on.
	record := cat(f.match(), f.isForwarded(o), f.loadFlow(), []expr.Any{updateFlow(o.forwarded)})
	// Send it on: source this interface, destination the previous owner's
	// MAC (the map's value for the destination IP), out of the interface it
	// came in on; then drop the original, which this node has no state for.
	// The destination lookup ends the rule when the IP is not forwarded.
	// The interface type check is what nft itself puts before an Ethernet
	// header write (Set also refuses an interface without a 6-byte MAC);
	// with it, nft lists the rule as "ether daddr set ...".
	forward := cat(f.match(), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFTYPE, Register: regScratch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regScratch, Data: binaryutil.NativeEndian.PutUint16(unix.ARPHRD_ETHER)},
		f.loadDaddr(),
		&expr.Lookup{SourceRegister: regScratch, DestRegister: regScratch, IsDestRegSet: true, SetName: o.vips.Name, SetID: o.vips.ID},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: regScratch,
			Base: expr.PayloadBaseLLHeader, Offset: etherDaddrOff, Len: etherAddrLen},
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: o.counter.Name},
		&expr.Immediate{Register: regScratch, Data: ownMAC},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: regScratch,
			Base: expr.PayloadBaseLLHeader, Offset: etherSaddrOff, Len: etherAddrLen},
		&expr.Meta{Key: expr.MetaKeyIIF, Register: regScratch},
		&expr.Dup{RegDev: regScratch, IsRegDevSet: true},
		&expr.Verdict{Kind: expr.VerdictDrop},
	})
	return [][]expr.Any{started, known, record, forward}
}

// ruleComments label the rules of rules() in `nft list ruleset`.
var ruleComments = []string{
	"flow starts here: serve it here",
	"flow started here: serve it here",
	"flow unknown here: count it",
	"flow unknown here: send it on to the previous owner",
}

func comment(s string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, s)
}
