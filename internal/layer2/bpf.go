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
