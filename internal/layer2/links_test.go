package layer2

import (
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/bpf"
)

func TestLinksChanged(t *testing.T) {
	base := []Link{probeLink("eth0", 2, eth0MAC), probeLink("eth1", 3, eth1MAC)}
	mod := func(i int, f func(*Link)) []Link {
		out := slices.Clone(base)
		f(&out[i])
		return out
	}
	for _, tc := range []struct {
		name string
		cur  []Link
		want bool
	}{
		{"same", slices.Clone(base), false},
		{"MAC changed (not watched)", mod(0, func(l *Link) { l.MAC = mustMAC("02:00:00:00:00:77") }), false},
		{"carrier lost", mod(1, func(l *Link) { l.Carrier = false }), true},
		{"down", mod(0, func(l *Link) { l.Up = false }), true},
		{"address added", mod(0, func(l *Link) { l.Prefixes = append(slices.Clone(l.Prefixes), netip.MustParsePrefix("10.0.0.1/8")) }), true},
		{"prefix length changed", mod(0, func(l *Link) { l.Prefixes = []netip.Prefix{netip.MustParsePrefix("192.0.2.2/25"), l.Prefixes[1]} }), true},
		{"link removed", base[:1], true},
		{"link added", append(slices.Clone(base), probeLink("eth2", 4, "02:00:00:00:00:03")), true},
	} {
		if got := linksChanged(base, tc.cur); got != tc.want {
			t.Errorf("%s: linksChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestAnnouncerLinks(t *testing.T) {
	var calls atomic.Int32
	n := startTestNet(t, Options{GratuitousCount: -1, OnLinksChanged: func() { calls.Add(1) }},
		probeLink("eth1", 3, eth1MAC), probeLink("eth0", 2, eth0MAC))
	waitFor(t, "OnLinksChanged after the first scan", func() bool { return calls.Load() == 1 })
	got := n.a.Links()
	if len(got) != 2 || got[0].Name != "eth0" || got[1].Name != "eth1" || len(got[0].Prefixes) != 2 {
		t.Fatalf("Links() = %+v, want eth0 and eth1 sorted by name, with prefixes", got)
	}
	// A link without carrier keeps its responder; the change is reported.
	n.mu.Lock()
	n.links[0].Carrier = false
	n.mu.Unlock()
	n.a.kickRescan()
	waitFor(t, "OnLinksChanged after carrier loss", func() bool { return calls.Load() == 2 })
	if l := n.a.Links(); l[1].Carrier {
		t.Errorf("eth1 Carrier still true: %+v", l[1])
	}
	if got := n.a.Interfaces(); !slices.Equal(got, []string{"eth0", "eth1"}) {
		t.Errorf("responders %v, want both (carrier does not decide eligibility)", got)
	}
}

// TestProberFilters runs the Prober's socket filters in x/net/bpf's
// interpreter.
func TestProberFilters(t *testing.T) {
	run := func(raw []bpf.RawInstruction, frame []byte) bool {
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
		return n > 0
	}
	arpF, err := probeAnswerFilter()
	if err != nil {
		t.Fatal(err)
	}
	naF, err := naFilter()
	if err != nil {
		t.Fatal(err)
	}
	probe, _ := arpProbe(mustMAC(eth0MAC), hostIP)
	garp, _ := gratuitousARP(hostMAC, hostIP)
	reply, _ := arpFrameBytes(arp.OperationReply, hostMAC, hostIP, clientMAC, clientIP, clientMAC)
	na := ipv6Frame(t, hostMAC, mustMAC(eth0MAC), host6, netip.MustParseAddr(ll0), &ndp.NeighborAdvertisement{Solicited: true, TargetAddress: host6})
	for _, tc := range []struct {
		name  string
		raw   []bpf.RawInstruction
		frame []byte
		want  bool
	}{
		{"answer to a probe", arpF, arpProbeAnswer(probe, hostMAC, hostIP), true},
		{"ordinary reply", arpF, reply, false},
		{"gratuitous reply", arpF, garp[1], false},
		{"request", arpF, arpRequest(t, hostIP, ethernet.Broadcast), false},
		{"NA", naF, na, true},
		{"NS", naF, solicit(t, host6), false},
		{"ARP on the NA socket", naF, reply, false},
	} {
		if got := run(tc.raw, tc.frame); got != tc.want {
			t.Errorf("%s: accepted=%v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestARPProbeMatchesLibrary(t *testing.T) {
	got, err := arpProbe(mustMAC(eth0MAC), vip1)
	if err != nil {
		t.Fatal(err)
	}
	want, err := arpFrameBytes(arp.OperationRequest, mustMAC(eth0MAC), netip.IPv4Unspecified(), make([]byte, 6), vip1, ethernet.Broadcast)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("hand-built probe\n% x\ndiffers from mdlayher/arp's\n% x", got, want)
	}
	if _, err := arpProbe(mustMAC(eth0MAC), vip6); err == nil {
		t.Errorf("probe for an IPv6 address built")
	}
}
