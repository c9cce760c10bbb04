package layer2

import (
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/bpf"
)

// TestOwnedARPFilter runs the generated socket filter in x/net/bpf's
// interpreter (the kernel's semantics for these instructions) on crafted
// frames.
func TestOwnedARPFilter(t *testing.T) {
	owned := []uint32{v4key(vip1), v4key(vip2)}
	for i := range 900 {
		owned = append(owned, v4key(netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)})))
	}
	raw, err := ownedARPFilter(owned)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > 4096 {
		t.Fatalf("filter has %d instructions, more than the kernel accepts", len(raw))
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("cannot disassemble")
	}
	vm, err := bpf.NewVM(withoutExtensions(insns))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(op arp.Operation, spa, tpa netip.Addr) []byte {
		b, err := arpFrameBytes(op, clientMAC, spa, ethernet.Broadcast, tpa, ethernet.Broadcast)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	last := netip.AddrFrom4([4]byte{10, 9, 3, 131}) // the 900th extra IP
	for _, tc := range []struct {
		name  string
		frame []byte
		want  bool
	}{
		{"request for an owned IP", mk(arp.OperationRequest, clientIP, vip2), true},
		{"request for the last owned IP", mk(arp.OperationRequest, clientIP, last), true},
		{"request for another IP", mk(arp.OperationRequest, clientIP, vipOff), false},
		{"reply from another host for an owned IP", mk(arp.OperationReply, vip1, clientIP), true},
		{"reply for another IP", mk(arp.OperationReply, vipOff, clientIP), false},
		{"reply targeting an owned IP", mk(arp.OperationReply, clientIP, vip1), false},
		{"IPv6 frame", ipv6Frame(t, clientMAC, ethernet.Broadcast, client6, vip6, &ndp.NeighborSolicitation{TargetAddress: vip6}), false},
	} {
		n, err := vm.Run(tc.frame)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if (n > 0) != tc.want {
			t.Errorf("%s: accepted %d bytes, want accepted=%v", tc.name, n, tc.want)
		}
	}
	empty, err := ownedARPFilter(nil)
	if err != nil {
		t.Fatal(err)
	}
	insns, _ = bpf.Disassemble(empty)
	vm, _ = bpf.NewVM(withoutExtensions(insns))
	if n, _ := vm.Run(mk(arp.OperationRequest, clientIP, vip1)); n != 0 {
		t.Errorf("empty owned set accepts frames")
	}
}

// withoutExtensions replaces the packet-type and VLAN-tag extension loads,
// which x/net/bpf's interpreter lacks, with 0: an untagged frame for this
// host (PACKET_HOST).
func withoutExtensions(insns []bpf.Instruction) []bpf.Instruction {
	out := make([]bpf.Instruction, len(insns))
	for i, in := range insns {
		if _, ok := in.(bpf.LoadExtension); ok {
			in = bpf.LoadConstant{Dst: bpf.RegA, Val: 0}
		}
		out[i] = in
	}
	return out
}

func TestStaticFilters(t *testing.T) {
	run := func(raw []bpf.RawInstruction, frame []byte) int {
		t.Helper()
		insns, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatal("cannot disassemble")
		}
		vm, err := bpf.NewVM(withoutExtensions(insns))
		if err != nil {
			t.Fatal(err)
		}
		n, err := vm.Run(frame)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	af, err := arpFilter()
	if err != nil {
		t.Fatal(err)
	}
	nf, err := ndpFilter()
	if err != nil {
		t.Fatal(err)
	}
	req := arpRequest(t, vipOff, ethernet.Broadcast)
	ns := solicit(t, vip6)
	if run(af, req) == 0 || run(af, ns) != 0 {
		t.Errorf("ARP filter: must accept ARP, drop IPv6")
	}
	if run(nf, ns) == 0 || run(nf, req) != 0 {
		t.Errorf("NDP filter: must accept a solicitation, drop ARP")
	}
	low := append([]byte(nil), ns...)
	low[21] = 64 // hop limit below 255: not a valid NDP message
	if run(nf, low) != 0 {
		t.Errorf("NDP filter accepts hop limit 64")
	}
}
