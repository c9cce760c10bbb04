package layer2

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// packetOtherHost is PACKET_OTHERHOST from linux/if_packet.h. Frames of
// type host (0), broadcast (1) and multicast (2) are for us; other-host (3:
// seen in promiscuous mode, or tagged for a VLAN this host does not have)
// and outgoing (4: our own frames, unless PACKET_IGNORE_OUTGOING took them
// out already) are not.
const packetOtherHost = 3

// prologue drops frames not addressed to this host and frames still
// carrying a VLAN tag: those belong to a VLAN whose own interface (if any)
// answers for it, and a reply from the parent would go out untagged.
func prologue() []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpLessThan, Val: packetOtherHost, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.LoadExtension{Num: bpf.ExtVLANTagPresent},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
	}
}

// require appends "drop unless the loaded value equals val".
func require(prog []bpf.Instruction, load bpf.Instruction, val uint32) []bpf.Instruction {
	return append(prog, load, bpf.JumpIf{Cond: bpf.JumpEqual, Val: val, SkipTrue: 1}, bpf.RetConstant{Val: 0})
}

// arpHeader appends the Ethernet/IPv4 ARP header checks.
func arpHeader(prog []bpf.Instruction) []bpf.Instruction {
	prog = require(prog, bpf.LoadAbsolute{Off: 12, Size: 2}, etherTypeARP)
	prog = require(prog, bpf.LoadAbsolute{Off: 14, Size: 4}, 0x00010800) // hardware type 1, protocol IPv4
	return require(prog, bpf.LoadAbsolute{Off: 18, Size: 2}, 0x0604)     // address lengths 6 and 4
}

// arpFilter accepts only incoming Ethernet/IPv4 ARP frames, so that the kernel
// drops everything else before it is queued to the socket. It accepts at most
// 64 bytes per frame: an ARP frame is 42 (60 padded).
func arpFilter() ([]bpf.RawInstruction, error) {
	prog := arpHeader(prologue())
	return assemble("ARP", append(prog, bpf.RetConstant{Val: 64}))
}

// ndpFilter accepts only incoming Ethernet/IPv6 frames whose next header is
// ICMPv6 with hop limit 255 and type Neighbor Solicitation or Advertisement:
// the only IPv6 traffic the responder looks at.
func ndpFilter() ([]bpf.RawInstruction, error) {
	return icmpv6Filter("NDP", icmpTypeNS, icmpTypeNA)
}

// naFilter accepts only incoming Neighbor Advertisements: what the Prober
// waits for.
func naFilter() ([]bpf.RawInstruction, error) {
	return icmpv6Filter("NA", icmpTypeNA, icmpTypeNA)
}

func icmpv6Filter(what string, type1, type2 uint32) ([]bpf.RawInstruction, error) {
	prog := prologue()
	prog = require(prog, bpf.LoadAbsolute{Off: 12, Size: 2}, etherTypeIPv6)
	prog = require(prog, bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 2}, protoICMPv6<<8|ndpHopLimit) // next header, hop limit
	prog = append(prog,
		bpf.LoadAbsolute{Off: ethHeaderLen + ipv6HeaderLen, Size: 1}, // ICMPv6 type
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: type1, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: type2, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 1 << 16},
	)
	return assemble(what, prog)
}

// probeAnswerFilter accepts only incoming ARP replies to RFC 5227 probes
// (target IP 0.0.0.0): what the Prober waits for. Ordinary ARP traffic on
// the segment never wakes it.
func probeAnswerFilter() ([]bpf.RawInstruction, error) {
	prog := arpHeader(prologue())
	prog = require(prog, bpf.LoadAbsolute{Off: 20, Size: 2}, arpOpReply)
	prog = require(prog, bpf.LoadAbsolute{Off: 38, Size: 4}, 0) // target IP
	return assemble("ARP probe answer", append(prog, bpf.RetConstant{Val: 64}))
}

func assemble(what string, prog []bpf.Instruction) ([]bpf.RawInstruction, error) {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("assembling %s socket filter: %w", what, err)
	}
	return raw, nil
}

// maxKernelFilterIPs bounds the owned-IP socket filter: 4 instructions per
// IP must fit the kernel's 4096-instruction limit. Beyond it the generic ARP
// filter is used and the owned-IP check happens in user space only.
const maxKernelFilterIPs = 1000

// ownedARPFilter accepts only the ARP frames a responder acts on: requests
// whose target is one of owned, and any frame whose sender is one of owned
// (conflict detection, probe answers). Everything else, notably a flood of
// requests for other hosts' addresses, is dropped in the kernel before it
// wakes the responder. An empty owned list drops everything. Comparisons
// are linear (two instructions per IP and field) with long jumps, since
// conditional jumps only reach 255 instructions.
func ownedARPFilter(owned []uint32) ([]bpf.RawInstruction, error) {
	if len(owned) == 0 {
		return assemble("owned-ARP", []bpf.Instruction{bpf.RetConstant{Val: 0}})
	}
	prog := arpHeader(prologue())
	var toAccept []int // indexes of long jumps to patch
	matchAny := func() {
		for _, ip := range owned {
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: ip, SkipTrue: 1})
			toAccept = append(toAccept, len(prog))
			prog = append(prog, bpf.Jump{})
		}
	}
	prog = append(prog, bpf.LoadAbsolute{Off: 28, Size: 4}) // sender IP
	matchAny()
	prog = append(prog,
		bpf.LoadAbsolute{Off: 20, Size: 2}, // operation
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arpOpRequest, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.LoadAbsolute{Off: 38, Size: 4}, // target IP
	)
	matchAny()
	prog = append(prog, bpf.RetConstant{Val: 0})
	accept := len(prog)
	prog = append(prog, bpf.RetConstant{Val: 64})
	for _, i := range toAccept {
		prog[i] = bpf.Jump{Skip: uint32(accept - i - 1)}
	}
	return assemble("owned-ARP", prog)
}
