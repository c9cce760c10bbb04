package layer2

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// packetOutgoing is PACKET_OUTGOING from linux/if_packet.h: frames this host
// sends, which a packet socket also sees unless PACKET_IGNORE_OUTGOING is set.
const packetOutgoing = 4

// arpFilter accepts only incoming Ethernet/IPv4 ARP frames, so that the kernel
// drops everything else before it is queued to the socket. It accepts at most
// 64 bytes per frame: an ARP frame is 42 (60 padded).
func arpFilter() ([]bpf.RawInstruction, error) {
	return assemble("ARP", []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: packetOutgoing, SkipTrue: 6},
		bpf.LoadAbsolute{Off: 12, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: etherTypeARP, SkipTrue: 4},
		bpf.LoadAbsolute{Off: 14, Size: 4}, // hardware type 1, protocol type IPv4
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x00010800, SkipTrue: 2},
		bpf.LoadAbsolute{Off: 18, Size: 2}, // address lengths 6 and 4
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0604, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 64},
	})
}

// ndpFilter accepts only incoming Ethernet/IPv6 frames whose next header is
// ICMPv6 with hop limit 255 and type Neighbor Solicitation or Advertisement:
// the only IPv6 traffic the responder looks at.
func ndpFilter() ([]bpf.RawInstruction, error) {
	const icmpType = ethHeaderLen + ipv6HeaderLen
	return assemble("NDP", []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: packetOutgoing, SkipTrue: 8},
		bpf.LoadAbsolute{Off: 12, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: etherTypeIPv6, SkipTrue: 6},
		bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 2}, // next header, hop limit
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: protoICMPv6<<8 | ndpHopLimit, SkipTrue: 4},
		bpf.LoadAbsolute{Off: icmpType, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: icmpTypeNS, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: icmpTypeNA, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 1 << 16},
	})
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
	prog := []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: packetOutgoing, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.LoadAbsolute{Off: 12, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: etherTypeARP, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.LoadAbsolute{Off: 14, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x00010800, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.LoadAbsolute{Off: 18, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0604, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
	}
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
